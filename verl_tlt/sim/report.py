"""What `verl-tlt simulate` prints and writes: a scenario's runs side by side, and the paper table."""

from __future__ import annotations

import statistics
from typing import Any

from verl_tlt.sim.paper import CellResult
from verl_tlt.sim.rl_step import RunResult, speedups
from verl_tlt.sim.scenario import Scenario

RUN_HEADER = (
    f"{'run':<14}{'step s':>8}{'rollout s':>10}{'train s':>9}{'e2e x':>7}{'rollout x':>10}{'tail s':>8}"
    f"{'SD share':>9}{'accept':>8}{'idle GPU-s':>11}{'harvested':>10}{'quality':>8}"
    f"{'idle %':>7}{'used %':>7}"
)


def run_lines(scenario: Scenario, runs: dict[str, RunResult]) -> list[str]:
    """Per run, means per RL step: times, speedups over the baseline, the tail, SD and the drafter."""
    ratios = speedups(runs)
    lines = [
        f"scenario {scenario.name}: {scenario.description}",
        f"  {scenario.cluster.nodes} node(s) x {scenario.cluster.gpus_per_node} GPUs, {scenario.cluster.replicas} "
        f"rollout replicas of TP {scenario.cluster.rollout_tp}; {scenario.steps} RL steps, seed {scenario.seed}; "
        "means per step",
        RUN_HEADER,
    ]
    for name, run in runs.items():
        steps = run.steps
        lines.append(
            f"{name:<14}{_mean(steps, 'step_s'):>8.1f}{_mean(steps, 'rollout_s'):>10.1f}"
            f"{_mean(steps, 'train_s') + _mean(steps, 'extra_s'):>9.1f}{ratios[name]['e2e']:>7.2f}"
            f"{ratios[name]['rollout']:>10.2f}{_mean(steps, 'tail_s'):>8.1f}{_mean(steps, 'speculative_share'):>9.2f}"
            f"{_mean(steps, 'acceptance'):>8.2f}{_mean(steps, 'idle_gpu_s'):>11.0f}"
            f"{_mean(steps, 'harvested_gpu_s'):>10.0f}"
            f"{_mean(steps, 'quality'):>8.2f}"
            f"{100 * _share(steps, 'idle_gpu_s'):>6.0f}%{100 * _share(steps, 'harvested_gpu_s'):>6.0f}%"
        )
    base = runs["baseline"]
    lengths = sorted(n for step in base.steps for n in step.lengths)
    if lengths:
        tail = sum(s.tail_s for s in base.steps) / base.rollout_s if base.rollout_s else 0.0
        lines.append(
            f"long tail: response p50 {_quantile(lengths, 0.5)}, p90 {_quantile(lengths, 0.9)}, p99 "
            f"{_quantile(lengths, 0.99)}, max {lengths[-1]} tokens; the baseline's slowest replica runs at most "
            f"{scenario.tlt.threshold} requests for {100 * tail:.0f}% of its rollout; rollout is "
            f"{100 * base.rollout_s / base.time_s:.0f}% of the baseline's step"
        )
    if scenario.sources:
        lines.append("assumptions and sources:")
        lines.extend(f"  - {source}" for source in scenario.sources)
    return lines


def run_json(scenario: Scenario, runs: dict[str, RunResult]) -> dict[str, Any]:
    ratios = speedups(runs)
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "sources": list(scenario.sources),
        "runs": {
            name: {
                "e2e_speedup": ratios[name]["e2e"],
                "rollout_speedup": ratios[name]["rollout"],
                "steps": [
                    {key: getattr(step, key) for key in STEP_KEYS} | {"step_s": step.step_s} for step in run.steps
                ],
            }
            for name, run in runs.items()
        },
    }


STEP_KEYS = (
    "rollout_s",
    "train_s",
    "extra_s",
    "idle_gpu_s",
    "harvested_gpu_s",
    "trained_gpu_s",
    "rollout_gpu_s",
    "quality",
    "tail_s",
    "speculative_share",
    "acceptance",
)


def paper_lines(cells: list[CellResult], projection: dict[str, dict[str, float]] | None) -> list[str]:
    lines = [
        "TLT end-to-end speedup over verl (baseline step time / TLT step time), paper vs simulation",
        f"{'model':<13}{'nodes':>6}{'paper':>7}{'sim':>7}{'error':>8}{'rollout share':>14}"
        f"{'fixed':>7}{'sd_always':>10}{'frozen':>8}{'no_spot':>8}",
    ]
    for cell in cells:
        e2e = {name: ratio["e2e"] for name, ratio in cell.speedups.items()}
        lines.append(
            f"{cell.cell.model:<13}{cell.cell.nodes:>6}{cell.cell.paper_speedup:>7.2f}{cell.simulated:>7.2f}"
            f"{100 * cell.error:>+7.0f}%{100 * cell.rollout_share:>13.0f}%"
            + "".join(f"{e2e.get(name, float('nan')):>{width}.2f}" for name, width in _ABLATION_WIDTHS)
        )
    lines.append(
        "ablations (e2e over the baseline): fixed = one strategy at or below the threshold, no bandit; sd_always = "
        "that strategy at every batch; frozen = no drafter training; no_spot = drafter trained after the rollout"
    )
    if projection:
        lines.append("projection, Qwen2.5-7B on 8 nodes (not measured by the paper; assumptions in the labels):")
        for label, ratio in projection.items():
            lines.append(f"  {label:<72} e2e {ratio['e2e']:.2f}x, rollout {ratio['rollout']:.2f}x")
    return lines


_ABLATION_WIDTHS = (("fixed", 7), ("sd_always", 10), ("frozen", 8), ("no_spot", 8))


def paper_json(cells: list[CellResult], projection: dict[str, dict[str, float]] | None) -> dict[str, Any]:
    return {
        "cells": [
            {
                "model": cell.cell.model,
                "preset": cell.cell.preset,
                "nodes": cell.cell.nodes,
                "paper_e2e_speedup": cell.cell.paper_speedup,
                "simulated_e2e_speedup": cell.simulated,
                "error": cell.error,
                "baseline_rollout_share": cell.rollout_share,
                "runs": cell.speedups,
            }
            for cell in cells
        ],
        "projection": projection or {},
    }


def _share(steps, key: str) -> float:
    """GPU-seconds of `key` over the rollout's GPU-seconds, summed over the steps."""
    total = sum(step.rollout_gpu_s for step in steps)
    return sum(getattr(step, key) for step in steps) / total if total else 0.0


def _mean(steps, key: str) -> float:
    return statistics.fmean(getattr(step, key) for step in steps)


def _quantile(values: list[int], q: float) -> int:
    return values[min(len(values) - 1, int(q * len(values)))]
