"""`verl-tlt bench adaptive`: the adaptive policy against plain decoding and every fixed strategy, on a replayed
long-tail rollout.

All N fresh prompts start together on the subject's target (`verl_tlt.bench.subject`: the trained toy by default, or a
real model; each with its warmed-up drafter), as in one RL rollout: the batch shrinks as short answers finish and a
few long ones decode alone at the end. The default token cap, 1024, is above the toy world's longest solution (937
tokens), so it cuts only answers that loop. Decoding is greedy, so every run produces the same tokens (checked) and
the runs differ only in time. Runs: plain; for each candidate strategy, that strategy at every decode step with at
most `threshold` running requests (plain above, like the policy); and the adaptive policy (`tlt.speculative` defaults
unless overridden), which knows what a TLT replica knows before its first rollout: its timed step costs and its
drafter's self-test probe (`replica_costs`). In RL the policy lives as long as the engine and keeps learning across
rollouts, so the headline adaptive run uses a policy that has already seen one rollout ("warm"); the first rollout of
a fresh policy is reported too ("cold"). Each run is timed best of `repeats`, the variants taking turns. The runs of
one round are close in time, so the best fixed strategy's time over adaptive's within each round
(`adaptive_vs_best_fixed_by_round`, and its median) cancels this shared machine's slow drift, which a ratio of two
best runs (from different rounds, each the luckiest of a few) does not; plain is run twice per round as the control
(`plain_vs_plain_by_round`: how far the same work strays between two runs of a round, i.e. what a per-round ratio can
resolve). Above the threshold adaptive and plain decode the same batches plainly, step for step, and the policy's
bookkeeping is the only difference; there each decode step's fastest time over the repeats is compared (step k of a
batch size in one run does the same work as step k in another), grouped by batch size (powers of two). On a shared
machine that comparison is noisy, so two more numbers frame it: the share of that time spent in the policy's own calls
(`policy_share_above_threshold`, what the policy can cost there), and the same comparison for each fixed strategy,
which decodes plainly there too, with a trivial policy (`fixed_vs_plain_above_threshold`: about the noise alone).
Ratios from one run of the command.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from verl_tlt.bench.subject import BenchSubject
from verl_tlt.config import DrafterConfig, SpeculativeConfig
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.config import EngineConfig
from verl_tlt.engine.drafts.self_test import DrafterSelfTest
from verl_tlt.engine.step_costs import measure_step_costs, timed_batch_sizes
from verl_tlt.files import write_json
from verl_tlt.policy import AdaptivePolicy, FixedBelowThreshold, SpeculationGate
from verl_tlt.policy.cost_model import CostModel
from verl_tlt.progress import Progress
from verl_tlt.spec.strategy import SpecStrategy

# The drafter probe's tokens, as a replica's default self-test (tlt.drafter.self_test_tokens).
SELF_TEST_TOKENS = DrafterConfig().self_test_tokens

PROBLEM_SEED = 31337
PLAIN_AGAIN = "plain_again"


class _PolicyClock:
    """Wraps a policy and times its calls for steps above its threshold: there the adaptive engine does what the
    plain one does plus these calls, so their time bounds what the policy can cost there (unlike whole step times,
    which this shared machine's drift moves by more than the 3% in question)."""

    def __init__(self, policy):
        self.policy, self.strategies, self.gate = policy, policy.strategies, policy.gate
        self.seconds_above_threshold = 0.0

    def _timed(self, batch_size: int, call, *args):
        start = time.perf_counter()
        result = call(*args)
        if not self.gate.speculates(batch_size):
            self.seconds_above_threshold += time.perf_counter() - start
        return result

    def select(self, batch_size: int):
        return self._timed(batch_size, self.policy.select, batch_size)

    def observe(self, strategy, batch_size: int, *args) -> None:
        self._timed(batch_size, self.policy.observe, strategy, batch_size, *args)

    def bucket_of(self, batch_size: int):
        return self._timed(batch_size, self.policy.bucket_of, batch_size)

    @property
    def threshold(self) -> int:
        return self.gate.threshold


def timed_run(engine: RolloutEngine, prompts, params, policy) -> tuple[float, list, dict[int, list[float]], dict]:
    """Generate with `policy` attached; return wall seconds, outputs, per-batch-size decode step times and the
    engine's plain/SD counters for this run alone (with a policy, also `policy_seconds_above_threshold`: time spent
    in its calls for steps above its threshold)."""
    step_times: dict[int, list[float]] = defaultdict(list)
    engine.stats.take()  # this run's counters alone
    original = engine._decode_step
    clock = _PolicyClock(policy) if policy is not None else None

    def recording_step(forced):
        batch_size, start = len(engine.running), time.perf_counter()
        original(forced)
        step_times[batch_size].append(time.perf_counter() - start)

    engine.policy, engine._decode_step = clock, recording_step
    try:
        start = time.perf_counter()
        outputs = engine.generate(prompts, params)
        seconds, stats = time.perf_counter() - start, engine.stats.as_dict()
        if clock is not None:
            stats["policy_seconds_above_threshold"] = clock.seconds_above_threshold
        return seconds, outputs, step_times, stats
    finally:
        engine.policy = None
        del engine._decode_step


def interleaved_best(
    repeats: int, variants: dict[str, Callable[[], tuple]], progress: Progress | None = None
) -> tuple[dict[str, tuple], dict[str, list[float]]]:
    """Each variant's fastest of `repeats` timed runs, taken round-robin (one run of every variant per round, each
    round starting one variant later) so that slow drift of a shared machine, and whatever a run leaves behind for
    the next, fall on all variants alike; a variant's step times become each step's fastest over its runs
    (`fastest_steps`). Also returns each variant's seconds per round, in round order (for `paired_ratios`).
    `progress` advances by one after each run, between the timed runs."""
    results: dict[str, list[tuple]] = {name: [] for name in variants}
    names = list(variants)
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(variants[name]())
            if progress is not None:
                progress.advance(extra=f"round {round_index + 1}: {name}")
    best = {}
    for name, runs in results.items():
        seconds, outputs, _, stats = min(runs, key=lambda r: r[0])
        best[name] = (seconds, outputs, fastest_steps([steps for _, _, steps, _ in runs]), stats)
    return best, {name: [run[0] for run in runs] for name, runs in results.items()}


def paired_ratios(round_seconds: dict[str, list[float]], reference: str, variant: str) -> list[float]:
    """reference / variant seconds within each round. The runs of one round are minutes apart at most, so the
    machine's slow drift mostly cancels in each ratio, unlike in a ratio of the two best runs, which may come from
    different rounds (and the luckiest of a few runs is itself a noisy number)."""
    return [round(ref / var, 3) for ref, var in zip(round_seconds[reference], round_seconds[variant], strict=True)]


def fastest_steps(runs: list[dict[int, list[float]]]) -> dict[int, list[float]]:
    """The k-th decode step at each batch size: its fastest time over `runs` (steps every run has).

    Meaningful where the runs do the same work step for step (greedy, same policy), as above the threshold: a
    stall of this shared machine rarely hits the same step in every run, so the minimum is close to the step's
    own cost, while a slowdown of every step (a policy's overhead) stays in it.
    """
    fastest = {}
    for batch_size in set().union(*runs):
        series = [steps.get(batch_size, []) for steps in runs]
        count = min(len(times) for times in series)
        if count:
            fastest[batch_size] = [min(times[k] for times in series) for k in range(count)]
    return fastest


def above_threshold_groups(plain_steps, adaptive_steps, threshold: int, min_steps: int = 5) -> dict[str, dict]:
    """Plain vs adaptive decode time above the threshold, by batch-size group (powers of two).

    Both runs decode the same batches plainly there, so step k of a batch size in one is step k in the other;
    each group compares the summed times of the steps both have (per-step fastest times from `fastest_steps`).
    Groups with fewer than min_steps such steps are left out.
    """

    gate = SpeculationGate(threshold)

    def grouped(steps):
        groups = defaultdict(list)
        for batch_size in steps:
            if not gate.speculates(batch_size):
                groups[batch_size.bit_length()].append(batch_size)
        return groups

    result = {}
    for group, sizes in sorted(grouped(adaptive_steps).items()):
        plain_s = adaptive_s = 0.0
        steps = 0
        for batch_size in sizes:
            pairs = list(zip(plain_steps.get(batch_size, []), adaptive_steps[batch_size], strict=False))
            plain_s += sum(p for p, _ in pairs)
            adaptive_s += sum(a for _, a in pairs)
            steps += len(pairs)
        if steps < min_steps:
            continue
        result[f"{2 ** (group - 1)}-{2**group - 1}"] = {
            "steps": steps,
            "plain_step_ms": round(1000 * plain_s / steps, 3),
            "adaptive_step_ms": round(1000 * adaptive_s / steps, 3),
            "ratio": round(plain_s / adaptive_s, 3),
        }
    return result


def worst_above_threshold_ratio(plain_steps, adaptive_steps, threshold: int, min_steps: int = 5) -> float | None:
    """Worst (lowest) plain / adaptive time ratio over the groups of `above_threshold_groups`."""
    groups = above_threshold_groups(plain_steps, adaptive_steps, threshold, min_steps)
    return min(group["ratio"] for group in groups.values()) if groups else None


def bench_rollout(
    subject: BenchSubject,
    num_requests: int,
    max_tokens: int,
    warm_up_strategy: str,
    *,
    device: str = "cpu",
    cuda_graphs: bool = False,
):
    """The benchmark's workload: (engine, prompts, params) for `num_requests` fresh prompts of the subject decoded
    greedily up to `max_tokens`, on an engine already warmed up with `warm_up_strategy`."""
    config = EngineConfig(max_num_seqs=num_requests, cuda_graphs=cuda_graphs)
    engine = RolloutEngine.from_pretrained(
        str(subject.target), config=config, drafter=str(subject.drafter), device=device
    )
    prompts = subject.prompts(num_requests, PROBLEM_SEED)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    engine.generate(prompts[:4], params, strategy=warm_up_strategy)  # warm-up
    return engine, prompts, params


def run(
    json_path: str | None,
    num_requests: int,
    max_tokens: int,
    repeats: int,
    config: SpeculativeConfig,
    subject: BenchSubject,
    *,
    device: str = "cpu",
    cuda_graphs: bool = False,
) -> dict:
    rollout = bench_rollout(
        subject, num_requests, max_tokens, config.strategies[0], device=device, cuda_graphs=cuda_graphs
    )
    engine, prompts, params = rollout
    costs = replica_costs(engine, prompts[0], config)
    warm_policies = []
    variants = _variants(engine, prompts, params, config, warm_policies, costs)
    progress = Progress("bench adaptive", repeats * len(variants), unit="timed runs")
    best, round_seconds = interleaved_best(repeats, variants, progress)
    comparison = _comparison(best, round_seconds, config, num_requests)
    result = {
        "benchmark": "adaptive",
        **subject.about(),
        "num_requests": num_requests,
        "num_tokens": comparison.pop("num_tokens"),
        "max_tokens": max_tokens,
        "repeats": repeats,
        "device": device,
        "cuda_graphs": engine.runner.graphs.memory_report() if engine.runner.graphs is not None else None,
        "torch_threads": torch.get_num_threads(),
        "policy": {k: list(v) if isinstance(v, tuple) else v for k, v in config.__dict__.items()},
        **comparison,
        "final_policy_state": warm_policies[-1].state(),
    }
    _print_summary(result)
    if json_path:
        write_json(json_path, result)
    return result


def replica_costs(engine: RolloutEngine, probe_prompt, config: SpeculativeConfig) -> Callable[[], CostModel]:
    """What a TLT replica knows before its first rollout, as the torch rollout server measures it: its step costs
    (`measure_step_costs`) and its drafter's self-test probe on the first prompt; a factory of fresh cost models
    (each policy refines its own)."""
    begin = time.perf_counter()
    table = measure_step_costs(
        engine,
        timed_batch_sizes(config.threshold, engine.max_num_seqs),
        [SpecStrategy.parse(name) for name in config.arm_strategies],
        report=lambda line: print(f"step costs, {line}", flush=True),
    )
    probe = DrafterSelfTest(SELF_TEST_TOKENS, 0.0, engine.max_model_len)
    probe.remember(probe_prompt)
    probe.check(engine)
    print(
        f"replica costs timed in {time.perf_counter() - begin:.1f} s; drafter probe alpha {probe.reference}",
        flush=True,
    )
    strategies = {name: SpecStrategy.parse(name) for name in config.arm_strategies}
    return lambda: CostModel(table, strategies, prior_alpha=probe.reference)


def _variants(
    engine: RolloutEngine,
    prompts,
    params,
    config: SpeculativeConfig,
    warm_policies: list,
    costs: Callable[[], CostModel] | None = None,
) -> dict:
    """The timed runs of one round: plain, each fixed strategy, plain again (the noise), adaptive cold and warm
    (each warm policy is appended to `warm_policies`); costs: each adaptive policy's cost model, as a replica has
    (None: none)."""

    def adaptive() -> AdaptivePolicy:
        return AdaptivePolicy(config, costs() if costs is not None else None)

    def cold_run():
        return timed_run(engine, prompts, params, adaptive())

    def warm_run():
        policy = adaptive()
        timed_run(engine, prompts, params, policy)  # one rollout to learn from, as the previous RL step would be
        warm_policies.append(policy)
        return timed_run(engine, prompts, params, policy)

    variants = {"plain": lambda: timed_run(engine, prompts, params, None)}
    for strategy in config.strategies:
        fixed = FixedBelowThreshold(strategy, config.threshold)
        variants[strategy] = lambda fixed=fixed: timed_run(engine, prompts, params, fixed)
    # The negative control of the per-round ratios: the same plain run again, so its ratio to "plain" in each round
    # is the machine's noise alone. Placed mid-round, as far from "plain" as a fixed strategy is from adaptive.
    variants[PLAIN_AGAIN] = variants["plain"]
    variants["adaptive_cold"], variants["adaptive"] = cold_run, warm_run
    return variants


def _comparison(best: dict, round_seconds: dict, config: SpeculativeConfig, num_requests: int) -> dict:
    """The ratios of the best runs (and per round), the above-threshold groups and their negative control."""
    plain_s, reference, plain_steps, _ = best["plain"]
    tokens = sum(len(o.token_ids) for o in reference)
    print(f"{'plain':>10}: {tokens / plain_s:8.1f} tok/s ({tokens} tokens, {num_requests} requests)", flush=True)
    identical = all(
        [o.token_ids for o in outputs] == [o.token_ids for o in reference] for _, outputs, _, _ in best.values()
    )
    runs = {
        name: {"seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)}
        for name, (seconds, _, _, _) in best.items()
    }
    for strategy in config.strategies:
        seconds = best[strategy][0]
        print(f"{strategy:>10}: {tokens / seconds:8.1f} tok/s, {plain_s / seconds:.2f}x plain", flush=True)
    cold_s = best["adaptive_cold"][0]
    adaptive_s, _, adaptive_steps, adaptive_stats = best["adaptive"]
    best_fixed = min(config.strategies, key=lambda s: runs[s]["seconds"])
    by_round = paired_ratios(round_seconds, best_fixed, "adaptive")
    gate = config.gate
    above_s = sum(sum(times) for batch_size, times in adaptive_steps.items() if not gate.speculates(batch_size))
    # The negative control: above the threshold a fixed strategy decodes plainly like the plain run, plus a trivial
    # policy's calls, so how far its group ratios stray from 1.0 is about what this machine's noise does to the
    # comparison.
    control = {
        strategy: {
            group: values["ratio"]
            for group, values in above_threshold_groups(plain_steps, best[strategy][2], config.threshold).items()
        }
        for strategy in config.strategies
    }
    return {
        "num_tokens": tokens,
        "runs": runs,
        "best_fixed_strategy": best_fixed,
        "adaptive_vs_best_fixed": round(runs[best_fixed]["seconds"] / adaptive_s, 3),
        "adaptive_vs_best_fixed_by_round": by_round,
        "adaptive_vs_best_fixed_median_round": statistics.median(by_round),
        "plain_vs_plain_by_round": paired_ratios(round_seconds, "plain", PLAIN_AGAIN),
        "adaptive_vs_plain": round(plain_s / adaptive_s, 3),
        "adaptive_cold_vs_plain": round(plain_s / cold_s, 3),
        "worst_above_threshold_vs_plain": worst_above_threshold_ratio(plain_steps, adaptive_steps, config.threshold),
        "above_threshold_groups": above_threshold_groups(plain_steps, adaptive_steps, config.threshold),
        "policy_share_above_threshold": (
            round(adaptive_stats["policy_seconds_above_threshold"] / above_s, 5) if above_s else None
        ),
        "fixed_vs_plain_above_threshold": control,
        "outputs_identical": identical,
        "adaptive_engine_stats": adaptive_stats,
    }


def _print_summary(result: dict) -> None:
    runs, tokens = result["runs"], result["num_tokens"]
    control_ratios = [
        ratio for groups in result["fixed_vs_plain_above_threshold"].values() for ratio in groups.values()
    ]
    print(
        f"{'adaptive':>10}: {runs['adaptive']['tokens_per_s']:8.1f} tok/s warm "
        f"({runs['adaptive_cold']['tokens_per_s']:.1f} cold), {result['adaptive_vs_plain']:.2f}x plain, "
        f"{result['adaptive_vs_best_fixed']:.2f}x best fixed ({result['best_fixed_strategy']}; per round "
        f"{result['adaptive_vs_best_fixed_by_round']}, median {result['adaptive_vs_best_fixed_median_round']}; plain "
        f"against itself per round, the noise: {result['plain_vs_plain_by_round']}); above the threshold adaptive "
        f"steps run at {result['worst_above_threshold_vs_plain']}x plain speed (worst batch size), of which the "
        f"policy's own calls take {result['policy_share_above_threshold']} (fixed strategies, which decode plainly "
        f"there too: {min(control_ratios, default=None)}-{max(control_ratios, default=None)}x); outputs identical: "
        f"{result['outputs_identical']}; {tokens} tokens",
        flush=True,
    )
