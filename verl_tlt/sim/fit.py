"""A scenario fitted to runs we can make: the CPU quickstart's rollout records turned into a simulator preset.

From the baseline run's records: each rollout's response lengths (the length trace) and its plain decode steps'
measured cost by batch group, fitted by least squares (weighted by steps) to t(batch) = fixed_s + per_token_s *
batch (`LinearCost`); prefill seconds per admission from the engines' busy time outside decode steps. From a
speculative run's records (the frozen-drafter run: its drafter does not change, so its acceptance is one number):
each drafter arm's tokens per row per step, inverted to a per-position acceptance (`alpha_for_length`, weighted by
steps), and the drafter's cost as a fraction of a plain step, fitted by least squares on the arms' step seconds.

Unlike `simulate replay`, which replays each run with its own measured steps, a fitted scenario predicts runs from
a model with a handful of numbers, so `simulate run --config` on it is a check of the whole simulator (policy,
costs, acceptance) against measured rollout times, and the same machinery prices the GPU presets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from verl_tlt.policy import PLAIN
from verl_tlt.sim.acceptance import alpha_for_length
from verl_tlt.sim.calibration import RecordedRollout, mean_batch, replay
from verl_tlt.spec.strategy import SpecStrategy


@dataclass(frozen=True)
class PlainFit:
    fixed_s: float
    per_token_s: float

    def seconds(self, batch: float) -> float:
        return self.fixed_s + self.per_token_s * batch


def fit_plain(costs: Mapping[int, Mapping[str, list[float]]]) -> PlainFit:
    """Least squares of plain seconds per step on the mean batch, each group weighted by its steps."""
    points = [
        (arms[PLAIN][0] / arms[PLAIN][2], arms[PLAIN][1] / arms[PLAIN][2], arms[PLAIN][2])
        for arms in costs.values()
        if arms.get(PLAIN) and arms[PLAIN][2]
    ]
    if not points:
        raise ValueError("no plain decode steps in the records: fit a baseline (TLT off) run")
    weight = sum(w for _, _, w in points)
    mean_x = sum(x * w for x, _, w in points) / weight
    mean_y = sum(y * w for _, y, w in points) / weight
    spread = sum(w * (x - mean_x) ** 2 for x, _, w in points)
    slope = sum(w * (x - mean_x) * (y - mean_y) for x, y, w in points) / spread if spread > 0 else 0.0
    slope = max(slope, 0.0)
    return PlainFit(max(mean_y - slope * mean_x, 1e-6), slope)


def fit_drafter(
    costs: Mapping[int, Mapping[str, list[float]]], plain: PlainFit
) -> tuple[float, float, dict[str, float]]:
    """(drafter_fraction, per-position acceptance, acceptance length per arm) from a speculative run's drafter arms.

    A step of arm d_1_d at mean batch b is modelled as d * f * plain(b) + plain(b) + per_token_s * b * d (the verify
    forward's extra d tokens per row); f is the least-squares fit over every arm and group (weighted by steps)."""
    numerator = denominator = 0.0
    alpha_sum = steps_sum = 0.0
    lengths: dict[str, list[float]] = {}
    for group, arms in costs.items():
        batch = mean_batch(int(group), arms)
        for name, (tokens, seconds, steps) in arms.items():
            if name == PLAIN or not steps:
                continue
            strategy = SpecStrategy.parse(name)
            if not strategy.uses_drafter or strategy.uses_group_drafts:
                continue
            base = plain.seconds(batch) + plain.per_token_s * batch * strategy.tree_tokens
            drafting = strategy.depth * plain.seconds(batch)
            numerator += steps * drafting * (seconds / steps - base)
            denominator += steps * drafting * drafting
            per_row = min(max(tokens / (steps * batch), 1.0), strategy.depth + 1.0)
            alpha_sum += steps * alpha_for_length(per_row, strategy.depth)
            steps_sum += steps
            entry = lengths.setdefault(name, [0.0, 0.0])
            entry[0] += per_row * steps
            entry[1] += steps
    if not steps_sum:
        raise ValueError("no drafter steps in the records: fit a run with TLT on (the frozen-drafter run)")
    fraction = max(numerator / denominator, 0.0) if denominator else 0.0
    return fraction, alpha_sum / steps_sum, {name: total / n for name, (total, n) in lengths.items()}


def arrival_spread(rollouts: list[RecordedRollout]) -> float:
    """Mean seconds between a rollout's first and last request arriving at a replica (verl's agent loop submits
    them over time; on a 2-core host that takes a noticeable share of a short rollout)."""
    return sum(max(a for rep in r.replicas for a in rep.arrivals) for r in rollouts) / len(rollouts)


def quickstart_scenario(
    baseline: tuple[list[RecordedRollout], dict],
    speculative: tuple[list[RecordedRollout], dict],
    *,
    lengths_file: str,
    other_s: float,
    strategies: list[str],
    threshold: int,
    sources: list[str],
) -> dict:
    """A scenario (the YAML's values) for a CPU run like the quickstart's: the rollout shape of the baseline run
    (replicas, requests per rollout), the fitted costs and acceptance, and the measured non-rollout seconds."""
    rollouts, plain_costs = baseline
    replicas = max(len(r.replicas) for r in rollouts)
    plain = fit_plain(plain_costs)
    fraction, alpha, per_arm = fit_drafter(speculative[1], plain)
    requests = max(sum(len(replica.lengths) for replica in r.replicas) for r in rollouts)
    arms = ", ".join(f"{name} {length:.2f}" for name, length in sorted(per_arm.items()))
    return {
        "description": f"the CPU quickstart's GRPO run on the toy target: {replicas} torch rollout replicas, "
        f"{requests} responses per step; costs and acceptance fitted to its rollout records",
        "sources": [
            *sources,
            f"plain decode step: {1000 * plain.fixed_s:.2f} ms + {1000 * plain.per_token_s:.3f} ms per running "
            "request (least squares on the baseline's plain steps by batch group)",
            f"drafter step: {fraction:.3f} of a plain step (least squares on the speculative run's drafter steps)",
            f"acceptance: per-position {alpha:.3f} (the speculative run's tokens per row per step: {arms})",
            "prefill: the baseline's engine-busy seconds outside decode steps, per admission step (as simulate replay "
            "spreads them); arrivals spread evenly over the baseline's mean submission spread (arrival_spread_s)",
            "training phases: the baseline's mean step time minus its rollout time (other_s)",
            "drafter quality held at 1: the fitted acceptance is the frozen drafter's average over the run",
        ],
        "cluster": {"nodes": 1, "gpus_per_node": replicas, "rollout_tp": 1, "accelerator": "cpu"},
        "model": "toy",
        "batch": {
            "prompts": requests,
            "group_size": 1,
            "prompt_tokens": 0,
            "arrival_spread_s": arrival_spread(rollouts),
        },
        "lengths": {"trace": lengths_file},
        "decode": {
            "kind": "linear",
            "fixed_s": plain.fixed_s,
            "per_token_s": plain.per_token_s,
            "drafter_fraction": fraction,
            "prefill_s": replay(rollouts, plain_costs).prefill_step_s,
        },
        "acceptance": {"kind": "chain", "eagle": alpha},
        "drafter": {"start": 1.0, "ceiling": 1.0, "floor": 1.0, "drift_per_step": 0.0, "recover_gpu_s": 1.0},
        "training": {"mfu": 1.0, "other_s": other_s},
        "tlt": {"threshold": threshold, "strategies": strategies},
        "runs": ["baseline", "tlt", "fixed"],
        "steps": len(rollouts),
        "max_num_seqs": 256,
    }
