"""`verl-tlt bench replay`: the adaptive policy against plain and every fixed strategy on a replayed rollout
(`verl_tlt.bench.replay`), from step costs recorded on the real engine.

Recording decodes `bench adaptive`'s rollout (the same prompts, greedy, the same token cap) plainly and with each
fixed strategy, `repeats` times each, and can be saved (`--save-costs`) and replayed later (`--costs`) under other
`tlt.speculative` settings: a policy change is then judged on the same recording, without this machine's drift.
"""

from __future__ import annotations

import statistics
import time

from verl_tlt.bench.adaptive_bench import bench_rollout
from verl_tlt.bench.replay import StepCosts, compare, nearest_batch_size
from verl_tlt.bench.subject import bench_subject
from verl_tlt.config import SpeculativeConfig
from verl_tlt.engine import RolloutEngine
from verl_tlt.files import write_json
from verl_tlt.policy import PLAIN, FixedBelowThreshold
from verl_tlt.progress import Progress


def record_step_costs(engine: RolloutEngine, prompts, params, strategies, threshold: int, repeats: int) -> StepCosts:
    """Decode the rollout plainly and with each fixed strategy (at or below the threshold), `repeats` times each, and
    keep every decode step's committed tokens per row and seconds, by strategy and batch size, for `replay`.

    The first speculative step of a run catches the drafter up on every token it has not seen (prompts and plainly
    decoded tokens); it is kept out of the step costs, and its excess over the strategy's median step at that batch
    size, per token caught up, gives the catch-up cost. Progress is reported between steps, outside their timing.
    """
    steps: dict[str, dict[int, list[tuple[float, float]]]] = {}
    catch_ups: list[tuple[str, int, float, int]] = []  # (strategy, batch size, seconds, tokens caught up)
    original = engine._decode_step
    last = [PLAIN]  # what the previous decode step of this run did
    progress = Progress("bench replay, recording step costs", repeats * (1 + len(strategies)), unit="rollouts")

    def recording_step(forced):
        batch_size = len(engine.running)
        unseen = sum(r.num_tokens - 1 - r.num_drafter_synced for r in engine.running)
        before_sd, before = engine.stats.steps_sd, sum(len(r.output_ids) for r in engine.running)
        start = time.perf_counter()
        original(forced)
        seconds = time.perf_counter() - start
        committed = sum(len(r.output_ids) for r in engine.running) - before
        name = PLAIN if engine.stats.steps_sd == before_sd else engine.policy.strategy.name
        if name != PLAIN and last[0] == PLAIN:  # the first speculative step after plain ones: the catch-up
            catch_ups.append((name, batch_size, seconds, unseen))
        else:
            steps.setdefault(name, {}).setdefault(batch_size, []).append((committed / batch_size, seconds))
        last[0] = name
        progress.heartbeat()

    policies = [None] + [FixedBelowThreshold(strategy, threshold) for strategy in strategies]
    engine._decode_step = recording_step
    try:
        for _ in range(repeats):
            for policy in policies:
                last[0] = PLAIN
                engine.stats.take()
                engine.policy = policy
                outputs = engine.generate(prompts, params)
                if engine.drafter_error is not None:  # its steps were recorded as plain ones: no recording
                    raise RuntimeError(f"the drafter failed while recording step costs: {engine.drafter_error}")
                progress.advance(extra="plain" if policy is None else policy.strategy.name)
    finally:
        engine.policy = None
        del engine._decode_step
    per_token = []
    for name, batch_size, seconds, unseen in catch_ups:
        by_size = steps.get(name, {})
        if by_size and unseen > 0:  # compared with the strategy's typical step at the nearest recorded batch size
            typical = statistics.median(s for _, s in by_size[nearest_batch_size(by_size, batch_size)])
            per_token.append(max(0.0, seconds - typical) / unseen)
    return StepCosts(
        lengths=[len(output.token_ids) - 1 for output in outputs],
        prompt_tokens=statistics.fmean(len(prompt) for prompt in prompts),
        catch_up_s_per_token=statistics.median(per_token) if per_token else 0.0,
        steps=steps,
        catch_up_samples=len(per_token),
    )


def run(
    json_path: str | None,
    config: SpeculativeConfig,
    *,
    costs_path: str | None,
    save_costs: str | None,
    num_requests: int,
    max_tokens: int,
    repeats: int,
    seeds: int,
    device: str = "cpu",
    cuda_graphs: bool = False,
) -> dict:
    if costs_path:
        costs = StepCosts.from_json(costs_path)
    else:
        engine, prompts, params = bench_rollout(
            bench_subject(), num_requests, max_tokens, config.strategies[0], device=device, cuda_graphs=cuda_graphs
        )
        costs = record_step_costs(engine, prompts, params, config.strategies, config.threshold, repeats)
        if save_costs:
            costs.to_json(save_costs)
    missing = sorted(set(config.strategies) - set(costs.steps))
    if missing:
        raise ValueError(
            f"the recording has no steps for {missing} (recorded: {sorted(costs.steps)}); record again "
            "with these strategies"
        )
    result = {
        "recorded_on": None if costs_path else {"device": device, "cuda_graphs": cuda_graphs},
        "benchmark": "replay",
        "costs": costs_path or save_costs,
        "seeds": seeds,
        "policy": {k: list(v) if isinstance(v, tuple) else v for k, v in config.__dict__.items()},
        "catch_up_us_per_token": round(1e6 * costs.catch_up_s_per_token, 3),
        **compare(config, costs, seeds, Progress("bench replay, replays", seeds * (len(config.strategies) + 3))),
    }
    for strategy, ratio in result["fixed_vs_plain"].items():
        print(f"{strategy:>10}: {ratio:.3f}x plain (replayed)", flush=True)
    print(
        f"{'adaptive':>10}: {result['adaptive_vs_plain']:.3f}x plain warm ({result['adaptive_cold_vs_plain']:.3f}x "
        f"cold), {result['adaptive_vs_best_fixed']:.3f}x best fixed ({result['best_fixed_strategy']}); mean of "
        f"{seeds} replays each",
        flush=True,
    )
    if json_path:
        write_json(json_path, result)
    return result
