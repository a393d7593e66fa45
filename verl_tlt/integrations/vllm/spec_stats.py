"""vLLM's per-step spec-decode stats, turned into the torch engine's counters (the same ``tlt/sd/*`` metrics).

vLLM reports, per engine step, ``SchedulerStats`` (running requests; ``spec_decoding_stats``: drafts verified,
draft tokens, accepted tokens, per position) and ``IterationStats`` (tokens generated) to the stat loggers of its
front end, and only when stat logging is on. The TLT server passes a logger (``stat_logger_factory``) that feeds
one ``SpecStepCounter``; the counter keeps:

- a ``DecodeStats`` like the torch engine's: steps and tokens with and without speculation, the strategy (a
  chain of K = draft tokens / drafts) per batch-size bucket, and committed tokens per verified row per strategy;
- the rollout's totals in the trace's terms (verify steps, draft tokens, accepted tokens, output tokens), from which
  the acceptance length follows as (accepted + verify steps) / verify steps.

A step that verified drafts is speculative; one that generated tokens without verifying any is plain. The batch
size of a speculative step is the number of drafts it verified (vLLM's running count, reported after the step,
can include requests that arrived meanwhile); of a plain step, the running requests vLLM reports with it. Seconds
per step are not reported by vLLM and stay 0. ``record_step`` is pure (no vLLM import) so tests can drive it.

While ``probing()``, steps count toward a ``ProbeTally`` instead: the drafter's self-test runs one request of its own
through the engine, and what it drafted and had accepted must not reach the rollout's stats.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from verl_tlt.metrics.rollout_trace import SD_COUNTERS
from verl_tlt.policy import DecodeStats, SpeculationGate
from verl_tlt.spec.strategy import SpecStrategy


@dataclass
class ProbeTally:
    """Draft tokens verified and accepted while probing (the self-test's request alone)."""

    drafted: int = 0
    accepted: int = 0


class SpecStepCounter:
    """Thread-safe: vLLM's output handler records, the server's RPCs read and reset."""

    def __init__(self, gate: SpeculationGate):
        """gate: the policy's (``tlt.speculative``), whose buckets label the steps as the torch engine's do."""
        self._gate = gate
        self._lock = threading.Lock()
        self.stats = DecodeStats()
        self.totals = dict.fromkeys(SD_COUNTERS, 0)
        self.accepted_per_position: list[int] = []
        self.max_sd_rows = 0  # most drafts one speculative step verified since the last take: its batch size
        self.preempted_requests = 0  # requests vLLM preempted (KV cache full), cumulative
        self._probe: ProbeTally | None = None

    @contextmanager
    def probing(self) -> Iterator[ProbeTally]:
        """Steps recorded inside go to the returned tally, not to the stats or totals. The caller runs nothing else
        on the engine meanwhile: vLLM records each step before it hands the step's outputs on, so the probe's last
        step is in the tally when its request returns."""
        tally = ProbeTally()
        with self._lock:
            self._probe = tally
        try:
            yield tally
        finally:
            with self._lock:
                self._probe = None

    def record_step(
        self,
        num_running: int,
        generated_tokens: int,
        num_drafts: int = 0,
        num_draft_tokens: int = 0,
        num_accepted: int = 0,
        accepted_per_position: Sequence[int] = (),
    ) -> None:
        with self._lock:
            if self._probe is not None:
                self._probe.drafted += num_draft_tokens
                self._probe.accepted += num_accepted
                return
            self.totals["num_output_tokens"] += generated_tokens
            if num_drafts > 0:
                k = round(num_draft_tokens / num_drafts)
                strategy = SpecStrategy(depth=max(k, 1))
                self.stats.record(strategy, num_drafts, num_accepted + num_drafts, 0.0, self._gate)
                self.totals["num_verify_steps"] += num_drafts
                self.totals["num_draft_tokens"] += num_draft_tokens
                self.totals["num_accepted_tokens"] += num_accepted
                if len(self.accepted_per_position) < len(accepted_per_position):
                    self.accepted_per_position += [0] * (len(accepted_per_position) - len(self.accepted_per_position))
                for position, count in enumerate(accepted_per_position):
                    self.accepted_per_position[position] += int(count)
                self.max_sd_rows = max(self.max_sd_rows, num_drafts)
            elif generated_tokens > 0:
                self.stats.record(None, max(num_running, 1), generated_tokens, 0.0, self._gate)

    def record_preemptions(self, count: int) -> None:
        with self._lock:
            self.preempted_requests += count

    def take_stats(self, reset: bool = True) -> dict[str, Any]:
        """The torch server's ``sd_stats`` dict (``DecodeStats.as_dict()`` plus ``drafter_error``)."""
        with self._lock:
            stats = self.stats.take() if reset else self.stats.as_dict()
            stats["drafter_error"] = None
            stats["accepted_per_position"] = list(self.accepted_per_position)
            stats["max_sd_rows"] = self.max_sd_rows
            if reset:
                self.accepted_per_position = []
                self.max_sd_rows = 0
        return stats

    def take_totals(self) -> dict[str, int]:
        """This rollout's trace counters (``RolloutTrace.sd_totals``' keys), and start afresh."""
        with self._lock:
            totals, self.totals = self.totals, dict.fromkeys(SD_COUNTERS, 0)
        return totals


def stat_logger_factory(counter: SpecStepCounter):
    """A vLLM ``StatLoggerFactory`` whose loggers feed `counter` (pass in ``stat_loggers=[...]``)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class TLTSpecStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            generated = iteration_stats.num_generation_tokens if iteration_stats is not None else 0
            running = scheduler_stats.num_running_reqs if scheduler_stats is not None else 0
            spec = scheduler_stats.spec_decoding_stats if scheduler_stats is not None else None
            preempted = getattr(iteration_stats, "num_preempted_reqs", 0)  # 0 where vLLM passes no iteration stats
            if preempted:
                counter.record_preemptions(preempted)
            if spec is None:
                counter.record_step(running, generated)
            else:
                counter.record_step(
                    running,
                    generated,
                    spec.num_drafts,
                    spec.num_draft_tokens,
                    spec.num_accepted_tokens,
                    spec.num_accepted_tokens_per_pos,
                )

        def log_engine_initialized(self) -> None:
            return None

    return TLTSpecStatLogger
