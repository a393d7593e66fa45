"""Time a replica's decode steps, per arm and batch size, before its first rollout speculates (policy.cost_model).

A few real engine steps per (arm, batch size): `batch_size` scratch requests (greedy, seeded, a short fixed prompt)
are admitted afresh for each arm, which runs one untimed step (the drafter's catch-up on the tokens it has not seen,
and any first-call cost) and `timed_steps` timed ones. Real steps, not a formula over forwards: they include the
drafter's passes, the verify forward, the tree and sampling work, and whatever kernels the engine uses. The engine's
counters, policy and group drafts are set aside meanwhile, so nothing of this shows in a rollout's statistics, and
the scratch requests are dropped at the end (their KV slots are rewritten at the next admission).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from verl_tlt.engine.engine import RolloutEngine
from verl_tlt.engine.sampling_params import SamplingParams
from verl_tlt.policy.cost_model import StepCostTable
from verl_tlt.policy.decode_stats import DecodeCosts, DecodeStats
from verl_tlt.policy.gate import PLAIN
from verl_tlt.spec.strategy import SpecStrategy

logger = logging.getLogger(__name__)

# Batch sizes timed (those up to the threshold and the engine's batch limit), and the prompt of each scratch request.
# Larger batches are extrapolated along the last two: timing 32 too doubled the start-up's cost on SmolLM2 on 2 cores
# (16.6 s for 1-32, each replica; most of it the speculative steps at 32).
TIMED_BATCH_SIZES = (1, 4, 16)
PROMPT_TOKENS = 16
TIMED_STEPS = 2


def timed_batch_sizes(threshold: int, max_num_seqs: int) -> list[int]:
    """The batch sizes to time: TIMED_BATCH_SIZES up to min(threshold, max_num_seqs), and that limit itself where it
    is below the largest of them."""
    limit = max(1, min(threshold, max_num_seqs))
    sizes = {size for size in TIMED_BATCH_SIZES if size <= limit}
    return sorted(sizes | ({limit} if limit < max(TIMED_BATCH_SIZES) else set()))


@torch.inference_mode()
def measure_step_costs(
    engine: RolloutEngine,
    batch_sizes: Sequence[int],
    strategies: Sequence[SpecStrategy],
    timed_steps: int = TIMED_STEPS,
    report: Callable[[str], None] | None = None,
) -> StepCostTable:
    """Seconds of one decode step per arm (plain, and each of `strategies`: drafter ones, the group-draft ones are
    skipped) at each of `batch_sizes`: the median of `timed_steps` steps. Call with no request in flight.
    report(line): told each batch size's costs as they are measured (progress)."""
    if engine.has_unfinished():
        raise RuntimeError("measure_step_costs needs an idle engine (requests are in flight)")
    arms: list[SpecStrategy | None] = [None]
    if engine.drafter is not None:
        arms += [s for s in strategies if not s.uses_group_drafts]
    deepest = max((s.depth for s in arms if s is not None), default=0)
    needed = (timed_steps + 1) * (deepest + 1) + 2  # every step committing all it can, and the prefill's token
    max_tokens = min(needed, engine.max_model_len - PROMPT_TOKENS - 1)
    if max_tokens < needed:
        raise ValueError(
            f"measure_step_costs needs max_model_len >= {PROMPT_TOKENS + needed + 1} to time every arm without a "
            f"scratch request finishing (got {engine.max_model_len})"
        )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, seed=0)
    saved = engine.stats, engine.decode_costs, engine.policy, engine.group_drafts
    group_drafts_error = engine.speculation.group_drafts_error
    engine.stats, engine.decode_costs, engine.policy, engine.group_drafts = DecodeStats(), DecodeCosts(), None, None
    seconds: dict[str, dict[int, float]] = {}
    try:
        for batch_size in batch_sizes:
            for arm in arms:  # fresh scratch requests per arm: each starts from the same short context
                _admit_scratch(engine, batch_size, params)
                timings = []
                for index in range(timed_steps + 1):
                    begin = time.perf_counter()
                    engine.step(arm)
                    if index:  # the first is the catch-up
                        timings.append(time.perf_counter() - begin)
                if engine.num_running != batch_size:
                    raise RuntimeError(f"a scratch request finished while timing {batch_size} rows")
                name = PLAIN if arm is None else arm.name
                seconds.setdefault(name, {})[batch_size] = sorted(timings)[len(timings) // 2]
                engine.reset()
            if report is not None:
                timed = ", ".join(f"{arm} {seconds[arm][batch_size] * 1e3:.1f} ms" for arm in seconds)
                report(f"batch {batch_size}: {timed}")
    finally:
        engine.reset()
        engine.stats, engine.decode_costs, engine.policy, engine.group_drafts = saved
        engine.speculation.group_drafts_error = group_drafts_error
    return StepCostTable(seconds)


def _admit_scratch(engine: RolloutEngine, batch_size: int, params: SamplingParams) -> None:
    """`batch_size` scratch requests running (prefilled), with distinct prompts: no two rows draft alike."""
    vocab = engine.model.spec.vocab_size
    for row in range(batch_size):
        engine.add_request([(7 + 31 * row + 13 * i) % (vocab - 1) + 1 for i in range(PROMPT_TOKENS)], params)
    for _ in range(batch_size):  # admission (prefill), in as many steps as the scheduler takes
        if engine.num_running >= batch_size:
            break
        engine.step()
    if engine.num_running != batch_size:
        raise RuntimeError(f"the engine runs {engine.num_running} of {batch_size} scratch requests at once")
