"""Replaying a recorded rollout in the simulator: what the torch rollout's trace says, turned into model inputs.

A rollout record (`verl_tlt.metrics.rollout_trace`, written with `engine_kwargs.torch.trace_path`) has, per
replica, each request's arrival and response length (`submit_times`, `finish_submit_index`, `response_tokens`) and
the decode steps' measured cost by batch-size group and arm (`decode_costs`: committed tokens, seconds, steps). The
calibration pools the decode costs of a run's rollouts into `MeasuredSteps`: at a batch of group g, a step costs what
the run's steps of group g cost on average, plain and speculative mixed in the proportion the run's policy chose
there, and commits per row what they committed. Prefill is not in `decode_costs`: its seconds per prefill step are
the run's engine-busy seconds outside decode steps, spread over the prefill steps the replay makes.

The replay then predicts each rollout's time from the recorded arrivals and lengths; against the recorded time it
says how far the event model is from the run. Pure Python: no verl, no torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_tlt.policy import PLAIN
from verl_tlt.sim.rollout import ReplicaTimeline, simulate_replica


@dataclass(frozen=True)
class ReplicaRequests:
    """One replica's requests of one rollout: arrival (seconds after the rollout's first arrival) and length."""

    arrivals: list[float]
    lengths: list[int]


@dataclass(frozen=True)
class RecordedRollout:
    """One training rollout: each replica's requests, its measured time (first arrival to last finish) and the
    engines' busy seconds outside decode steps (prefill)."""

    replicas: list[ReplicaRequests]
    time_s: float
    prefill_busy_s: float


def read_rollouts(trace_path: str | Path) -> tuple[list[RecordedRollout], dict[int, dict[str, list[float]]]]:
    """The training rollouts of a trace file and its pooled decode costs ({group: {arm: [tokens, seconds, steps]}})."""
    by_index: dict[int, list[dict]] = {}
    for line in Path(trace_path).read_text().splitlines():
        record = json.loads(line) if line.strip() else None
        if record and not record.get("validation"):
            by_index.setdefault(record["rollout_index"], []).append(record)
    rollouts, costs = [], {}
    for index in sorted(by_index):
        records = by_index[index]
        start = min(r["start"] for r in records)
        replicas = [_replica_requests(r, start) for r in records]
        last_finish = max(t for r in records for t in r["finish_times"])
        decode_s = sum(entry[1] for r in records for arms in r["decode_costs"].values() for entry in arms.values())
        rollouts.append(
            RecordedRollout(replicas, last_finish - start, sum(r["engine_busy_s"] for r in records) - decode_s)
        )
        for r in records:
            for group, arms in r["decode_costs"].items():
                for arm, entry in arms.items():
                    pooled = costs.setdefault(int(group), {}).setdefault(arm, [0.0, 0.0, 0.0])
                    for i in range(3):
                        pooled[i] += entry[i]
    return rollouts, costs


def _replica_requests(record: dict, start: float) -> ReplicaRequests:
    submits = record["submit_times"]
    order = record.get("finish_submit_index")
    if not order or None in order:
        raise ValueError(
            "This rollout record does not pair responses with their submissions (finish_submit_index): it was written "
            "by an older verl-tlt; record the run again to calibrate on it"
        )
    arrivals = [submits[i] - start for i in order]
    return ReplicaRequests(arrivals, list(record["response_tokens"]))


def mean_batch(group: int, arms: dict[str, list[float]]) -> float:
    """The mean batch of a group's steps: plain steps commit one token per row (tokens / steps); without plain steps
    the group's middle (groups are powers of two: g .. 2g - 1)."""
    plain = arms.get(PLAIN)
    return plain[0] / plain[2] if plain and plain[2] else 1.5 * group - 0.5


class MeasuredSteps:
    """Decode steps as a run measured them, by batch-size group (powers of two): mean seconds per step, and tokens per
    row per step, plain and speculative steps mixed in the run's proportion at that group."""

    def __init__(self, costs: dict[int, dict[str, list[float]]]):
        self.by_group: dict[int, tuple[float, float]] = {}
        for key, arms in costs.items():
            group = int(key)  # JSON keys are strings
            plain = arms.get(PLAIN, [0.0, 0.0, 0.0])
            speculative = [sum(entry[i] for arm, entry in arms.items() if arm != PLAIN) for i in range(3)]
            steps = plain[2] + speculative[2]
            if not steps:
                continue
            # Speculative steps of the group are taken to have the plain steps' mean batch.
            per_row = (plain[0] + speculative[0]) / (steps * mean_batch(group, arms))
            self.by_group[group] = ((plain[1] + speculative[1]) / steps, per_row)
        if not self.by_group:
            raise ValueError("no decode steps measured: nothing to calibrate on")

    def step(self, batch: int, kv_tokens: int = 0) -> tuple[float, float, str]:
        group = 1 << (batch.bit_length() - 1)
        nearest = min(self.by_group, key=lambda g: (abs(g - group), g))
        seconds, per_row = self.by_group.get(group, self.by_group[nearest])
        return seconds, max(per_row, 1.0), "measured"

    def observe(self, batch: int, committed: float, seconds: float) -> None:
        return None


@dataclass(frozen=True)
class ReplayResult:
    predicted_s: list[float]
    measured_s: list[float]
    prefill_step_s: float

    @property
    def total_ratio(self) -> float:
        """Predicted over measured rollout time, summed over the rollouts."""
        return sum(self.predicted_s) / sum(self.measured_s)


def replay(rollouts: Sequence[RecordedRollout], costs: dict, max_num_seqs: int = 256) -> ReplayResult:
    """Predict every recorded rollout's time from its arrivals and lengths and the run's measured steps."""
    steps = MeasuredSteps(costs)
    # First pass without prefill: how many prefill steps the replay makes, to spread the measured prefill seconds.
    prefills = sum(
        sum(1 for s in timeline.steps if s.arm == "prefill")
        for rollout in rollouts
        for timeline in _replay_rollout(rollout, steps, max_num_seqs, prefill_s=0.0)
    )
    prefill_s = sum(r.prefill_busy_s for r in rollouts) / prefills if prefills else 0.0
    predicted = [
        max(t.drained_s for t in _replay_rollout(rollout, steps, max_num_seqs, prefill_s)) for rollout in rollouts
    ]
    return ReplayResult(predicted, [r.time_s for r in rollouts], prefill_s)


def _replay_rollout(
    rollout: RecordedRollout, steps: MeasuredSteps, max_num_seqs: int, prefill_s: float
) -> list[ReplicaTimeline]:
    return [
        simulate_replica(r.lengths, steps, arrivals=r.arrivals, max_num_seqs=max_num_seqs, prefill_s=prefill_s)[0]
        for r in rollout.replicas
    ]
