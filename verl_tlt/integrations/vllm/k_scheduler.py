"""TLT's adaptive K inside vLLM: the project's ``AdaptivePolicy`` picks each step's chain depth K (0 = plain).

vLLM's dynamic speculative decoding asks ``Scheduler.dynamic_sd_lookup[n]`` for the K of every step, n being the
number of scheduled requests (prefills included), from a static per-batch-size schedule. TLT's scheduler (passed
as ``scheduler_cls``; it builds on vLLM's own ``Scheduler`` or ``AsyncScheduler``, whichever the engine would use)
replaces that lookup with one that:

- counts decode requests only (requests that have produced a token), so a burst of arriving prompts does not switch
  speculation off, and asks the policy for that batch size: plain above ``tlt.speculative.threshold``, at or below
  it the chain the bandit of the batch-size bucket picks, with the policy's hysteresis (``min_dwell_steps``) so a
  batch hovering at the threshold does not thrash;
- feeds the policy what each step committed (tokens sampled) per second of engine step, attributed to the K whose
  drafts that step verified (drafted one step earlier).

The policy's config travels to vLLM's engine-core process in ``POLICY_ENV`` (JSON of ``tlt.speculative``), set by
whoever starts the engine (``engine_setup.speculative_engine_args``). Runs in the engine core: no Ray, no verl.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from verl_tlt.config import SpeculativeConfig
from verl_tlt.policy.adaptive import AdaptivePolicy
from verl_tlt.spec.strategy import SpecStrategy

logger = logging.getLogger(__name__)

POLICY_ENV = "VERL_TLT_VLLM_K_POLICY"


def policy_env_value(speculative: SpeculativeConfig, chains: tuple[int, ...]) -> str:
    """The JSON the scheduler reads: `speculative` with its strategies replaced by the chains vLLM drafts."""
    config = dataclasses.asdict(speculative)
    config["strategies"] = [f"{k}_1_{k}" for k in chains]
    return json.dumps(config)


def policy_from_env() -> AdaptivePolicy:
    raw = os.environ.get(POLICY_ENV)
    if not raw:
        raise RuntimeError(f"TLT's vLLM scheduler needs {POLICY_ENV} (set by verl-tlt before the engine starts)")
    values = json.loads(raw)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return AdaptivePolicy(SpeculativeConfig(**values))


class PolicyLookup(Sequence):
    """Stands in for vLLM's ``dynamic_sd_lookup`` list: ``lookup[n]`` is the K the policy picks for this step.

    vLLM's scheduler indexes its dense table (index = scheduled requests) once per step; that index is what asks the
    policy. Everything else a list offers (length, iteration, slices, ``in``) reads vLLM's own table, which the
    engine built from ``policy_schedule`` and which lists every K the policy may pick: code that inspects the table
    sees what vLLM prepared for, and only the per-step index has the side effect of a choice.
    """

    def __init__(self, policy: AdaptivePolicy, scheduler: Any, table: Sequence[int]):
        self.policy, self.scheduler, self.table = policy, scheduler, list(table)
        self.chosen: list[tuple[SpecStrategy | None, int]] = []  # this step's choice, until its step is observed

    def decode_batch(self) -> int:
        return sum(1 for request in self.scheduler.running if request.num_output_tokens > 0)

    def __len__(self) -> int:
        return len(self.table)

    def __iter__(self) -> Iterator[int]:
        return iter(self.table)

    def __contains__(self, k: object) -> bool:
        return k in self.table

    def __getitem__(self, scheduled):  # int -> the policy's K now; slice -> vLLM's table
        if isinstance(scheduled, slice):
            return self.table[scheduled]
        if not -len(self.table) <= scheduled < len(self.table):
            raise IndexError(f"batch size {scheduled} is outside vLLM's schedule (max {len(self.table) - 1})")
        batch = self.decode_batch()
        strategy = self.policy.select(batch) if batch > 0 else None
        self.chosen.append((strategy, batch))
        return 0 if strategy is None else strategy.depth


def _with_policy(base: type) -> type:
    class TLTPolicyScheduler(base):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            table = getattr(self, "dynamic_sd_lookup", None)
            self.tlt_lookup = PolicyLookup(policy_from_env(), self, table or [])
            if table is None:
                # A vLLM without a per-step K lookup: keep its behaviour (the static schedule, if it has one).
                logger.warning(
                    "TLT: this vLLM's scheduler has no dynamic_sd_lookup; K follows the static per-batch-size schedule "
                    "(speculative_config.num_speculative_tokens_per_batch_size), not TLT's adaptive policy"
                )
                self.tlt_lookup.chosen = None
            else:
                self.dynamic_sd_lookup = self.tlt_lookup
            self._tlt_verifying: tuple[SpecStrategy | None, int] | None = None  # drafted last step, verified now
            self._tlt_last_update: float | None = None

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            now = time.perf_counter()
            lookup = self.tlt_lookup
            if lookup.chosen and scheduler_output.total_num_scheduled_tokens > 0:
                drafted_now = lookup.chosen.pop(0)
                if self._tlt_verifying is not None and self._tlt_last_update is not None:
                    strategy, batch = self._tlt_verifying
                    committed = sum(len(ids) for ids in (model_runner_output.sampled_token_ids or []))
                    if batch > 0 and committed > 0:
                        lookup.policy.observe(strategy, batch, committed, now - self._tlt_last_update)
                self._tlt_verifying = drafted_now
            self._tlt_last_update = now
            return outputs

    TLTPolicyScheduler.__qualname__ = f"TLTPolicyScheduler[{base.__name__}]"
    return TLTPolicyScheduler


class TLTKScheduler:
    """``scheduler_cls`` for vLLM: an instance of vLLM's scheduler (async or not, as configured) with TLT's policy."""

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any):
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        base = AsyncScheduler if vllm_config.scheduler_config.async_scheduling else Scheduler
        return _with_policy(base)(vllm_config, *args, **kwargs)
