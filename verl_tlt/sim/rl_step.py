"""Synchronous RL steps on a simulated cluster: rollout on every replica, then the training phases, step after step,
for each run of a scenario (the baseline, TLT, and the ablations and projections it names).

One step: each replica prefills its share of the step's prompts and decodes it (`rollout.simulate_replica`, one
policy per replica that lives across steps, as each rollout engine keeps its own); the rollout ends when the slowest
replica drains. Replicas that drained earlier sit idle until then: their GPU-seconds are what spot training
harvests. Then the log-prob passes, the update and the weight sync run on all GPUs. Every run sees the same response
lengths at the same step (speculative decoding is lossless: the responses do not change, only their speed).

The runs (`scenario.RUNS`):
- baseline: plain decoding.
- tlt: the project's `AdaptivePolicy` deciding every step of every replica, the drafter trained on harvested GPUs.
- fixed: one strategy at or below the threshold, no bandit. sd_always: one strategy at every batch size (no switch).
- frozen: `tlt` with a drafter that never trains (its quality drifts with the policy).
- no_spot: `tlt` whose drafter trains after the rollout instead, on all GPUs, for `drafter.recover_gpu_s` GPU-seconds.
- group_drafts (projection): `tlt` plus the group strategies as arms (suffix drafts from sibling answers).
- partial (projection): `tlt` where a response decodes at most `partial_budget_tokens` per step and is paused
  there, resuming next step (partial rollouts); partial_plain: the same without speculative decoding. Unlike TLT,
  partial rollouts change what is trained on (a response spans policy versions); the model counts only their speed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from verl_tlt.config import SpeculativeConfig
from verl_tlt.policy import PLAIN, AdaptivePolicy, FixedBelowThreshold, SpeculationGate
from verl_tlt.sim.rollout import PREFILL, PolicySteps, ReplicaTimeline, simulate_replica
from verl_tlt.sim.roofline import ACCELERATORS, MODELS
from verl_tlt.sim.scenario import Scenario


@dataclass
class StepResult:
    rollout_s: float
    train_s: float
    extra_s: float  # no_spot: the drafter's separate training phase
    idle_gpu_s: float  # GPU-seconds of replicas drained while another still decoded
    harvested_gpu_s: float  # of those, what spot training used
    trained_gpu_s: float  # GPU-seconds the drafter trained for in this step (spot or not)
    rollout_gpu_s: float
    quality: float
    tail_s: float  # rollout seconds in which the slowest replica ran at most `threshold` rows
    speculative_share: float  # of all replicas' decode seconds, the share spent in speculative steps
    acceptance: float  # mean tokens per row per speculative step (1 without any)
    lengths: list[int] = field(repr=False, default_factory=list)
    timelines: list[ReplicaTimeline] = field(repr=False, default_factory=list)

    @property
    def step_s(self) -> float:
        return self.rollout_s + self.train_s + self.extra_s


@dataclass
class RunResult:
    name: str
    steps: list[StepResult]

    @property
    def time_s(self) -> float:
        return sum(step.step_s for step in self.steps)

    @property
    def rollout_s(self) -> float:
        return sum(step.rollout_s for step in self.steps)


def simulate_scenario(
    scenario: Scenario, base_dir: Path | None = None, keep_timelines: bool = False, progress=None
) -> dict[str, RunResult]:
    """Every run the scenario names, in its order."""
    results = {}
    for run in scenario.runs:
        results[run] = simulate_run(scenario, run, base_dir, keep_timelines)
        if progress is not None:
            progress(run)
    return results


def simulate_run(scenario: Scenario, run: str, base_dir: Path | None = None, keep_timelines: bool = False) -> RunResult:
    cost = scenario.speculative_cost(base_dir)
    length_model = scenario.length_model(base_dir)
    base_acceptance = scenario.acceptance_model()
    replicas = scenario.cluster.replicas
    policies = [_policy(scenario, run, replica) for replica in range(replicas)]
    prompts = scenario.batch.prompts_for(scenario.cluster.nodes)
    quality, carried, steps = scenario.drafter.start, [], []
    for step in range(scenario.steps):
        rng = random.Random(scenario.seed * 7919 + step)  # the same lengths at this step in every run
        lengths = length_model.step(step, prompts, scenario.batch.group_size, rng)
        # Requests to decode this step: (tokens to decode now, tokens of context already there), grouped by prompt.
        requests = carried + [(length, scenario.batch.prompt_tokens) for length in lengths]
        carried = []
        if run in ("partial", "partial_plain"):
            budget = scenario.tlt.partial_budget_tokens
            carried = [(tokens - budget, context + budget) for tokens, context in requests if tokens > budget]
            requests = [(min(tokens, budget), context) for tokens, context in requests]
        acceptance = base_acceptance.scaled(quality)
        timelines = []
        for replica in range(replicas):
            mine = requests[replica::replicas]  # verl splits a step's requests evenly over the replicas
            spread = scenario.batch.arrival_spread_s
            arrivals = [spread * (replica + i * replicas) / len(requests) for i in range(len(mine))]
            if not mine:
                timelines.append(ReplicaTimeline())
                continue
            steps_model = PolicySteps(cost, policies[replica], acceptance)
            prefill_s = scenario.prefill_s
            if prefill_s is None:  # the prompts' forward, priced by the cost model
                prefill_s = cost.target.step_seconds(len(mine), max(1, round(sum(c for _, c in mine) / len(mine))))
            timeline, _ = simulate_replica(
                [tokens for tokens, _ in mine],
                steps_model,
                arrivals=arrivals,
                max_num_seqs=scenario.max_num_seqs,
                prefill_s=prefill_s,
                prompt_tokens=[context for _, context in mine],
            )
            timelines.append(timeline)
        result = _step_result(scenario, run, timelines, [t for t, _ in requests], [c for _, c in requests], quality)
        result.lengths = lengths
        if keep_timelines:
            result.timelines = timelines
        steps.append(result)
        quality = scenario.drafter.next_quality(quality, result.trained_gpu_s)
    return RunResult(run, steps)


ONLINE_DRAFTER_RUNS = ("tlt", "no_spot", "group_drafts", "partial")


def _step_result(scenario, run, timelines, tokens, contexts, quality) -> StepResult:
    rollout_s = max((t.drained_s for t in timelines), default=0.0)
    idle_gpu_s = sum(rollout_s - t.drained_s for t in timelines) * scenario.cluster.rollout_tp
    online = run in ONLINE_DRAFTER_RUNS
    slowest = max(timelines, key=lambda t: t.drained_s)
    decode = [s for t in timelines for s in t.steps if s.arm != PREFILL]
    decode_s = sum(s.seconds * s.count for s in decode)
    speculative = [s for s in decode if s.arm != PLAIN]
    rows = sum(s.batch * s.count for s in speculative)
    gate = SpeculationGate(scenario.tlt.threshold)
    return StepResult(
        rollout_s=rollout_s,
        train_s=training_seconds(scenario, tokens, contexts),
        # no_spot: the drafter trains after the rollout on the whole cluster, for recover_gpu_s GPU-seconds (closing
        # 63% of its gap), instead of in the idle time.
        extra_s=scenario.drafter.recover_gpu_s / scenario.cluster.gpus if run == "no_spot" else 0.0,
        idle_gpu_s=idle_gpu_s,
        harvested_gpu_s=idle_gpu_s if online and run != "no_spot" else 0.0,
        trained_gpu_s=(scenario.drafter.recover_gpu_s if run == "no_spot" else idle_gpu_s) if online else 0.0,
        rollout_gpu_s=rollout_s * scenario.cluster.gpus,
        quality=quality,
        tail_s=sum(s.seconds * s.count for s in slowest.steps if s.arm != PREFILL and gate.speculates(s.batch)),
        speculative_share=sum(s.seconds * s.count for s in speculative) / decode_s if decode_s else 0.0,
        acceptance=sum(s.committed for s in speculative) / rows if rows else 1.0,
    )


def training_seconds(scenario: Scenario, tokens: list[int], contexts: list[int]) -> float:
    """Log-prob passes and the update on all GPUs: 2 FLOPs per parameter and token per forward (3 forwards' worth for
    forward + backward), plus causal attention, at the scenario's MFU; then the weight sync and other fixed seconds.
    A CPU scenario (no accelerator) gives its phases as fixed seconds only."""
    training = scenario.training
    if scenario.cluster.accelerator not in ACCELERATORS or scenario.model not in MODELS:
        return training.weight_sync_s + training.other_s
    shape, accelerator = MODELS[scenario.model], ACCELERATORS[scenario.cluster.accelerator]
    forwards = training.forward_passes + 3
    sequence_flops = 0.0
    for response, context in zip(tokens, contexts, strict=True):
        n = response + context
        sequence_flops += 2 * shape.matmul_params * n + 2 * shape.layers * shape.hidden * n * n
    seconds = forwards * sequence_flops / (scenario.cluster.gpus * accelerator.peak_flops * training.mfu)
    return seconds + training.weight_sync_s + training.other_s


def _policy(scenario: Scenario, run: str, replica: int):
    if run in ("baseline", "partial_plain"):
        return None
    settings = scenario.tlt
    if run in ("fixed", "sd_always"):
        strategy = settings.fixed_strategy or settings.strategies[0]
        return FixedBelowThreshold(strategy, settings.threshold if run == "fixed" else scenario.max_num_seqs)
    values = {"threshold": settings.threshold, "strategies": settings.strategies, "seed": scenario.seed + replica}
    if settings.buckets is not None:
        values["buckets"] = settings.buckets
    if run == "group_drafts":
        values.update(group_drafts=True, group_strategies=settings.group_strategies)
    return AdaptivePolicy(SpeculativeConfig(**values))


def speedups(results: dict[str, RunResult]) -> dict[str, dict[str, float]]:
    """Each run's e2e and rollout speedup over the baseline (baseline time / run time)."""
    base = results["baseline"]
    return {
        name: {"e2e": base.time_s / run.time_s, "rollout": base.rollout_s / run.rollout_s}
        for name, run in results.items()
    }
