"""What a draft token costs the drafter with its draft vocabulary against the same drafter over the full LM head.

Part of `verl-tlt bench sd curve` when the drafter has a draft vocabulary. Real speculative steps of one chain
strategy run at batch 1 on a prefilled random prompt, with the drafter's calls timed inside them (`sd_overhead`);
the drafter then drafts over the target's whole vocabulary (`set_draft_vocab(None)`) for as many steps, and back.
A chain drafts `depth` tokens a step, so drafter time per step / depth is the cost per draft token. The two
settings alternate over a few rounds and each keeps its best round, so a slow moment of a shared machine does not
land on one side only.
"""

from __future__ import annotations

import torch

from verl_tlt.bench.sd_overhead import bench_sd_overhead
from verl_tlt.bench.verify_bench import prefill
from verl_tlt.engine import RolloutEngine
from verl_tlt.spec.strategy import SpecStrategy

CONTEXT_LEN = 64
STEPS, WARMUP, ROUNDS = 24, 3, 3


def drafting_cost(engine: RolloutEngine, strategies: list[str]) -> dict | None:
    """Drafter ms per draft token with and without the draft vocabulary (None: no chain strategy, or the drafter
    has no draft vocabulary). Leaves the engine empty and the drafter's vocabulary as it found it."""
    chains = [name for name in strategies if SpecStrategy.parse(name).is_chain]
    model = getattr(engine.drafter, "model", None)
    vocab = getattr(model, "draft_vocab", None)
    if not chains or vocab is None:
        return None
    strategy = SpecStrategy.parse(chains[0])
    best = {"draft_vocab": float("inf"), "full_head": float("inf")}
    saved_batch = engine.max_num_seqs
    engine.max_num_seqs = 1
    try:
        for round_number in range(ROUNDS):
            for name, setting in (("draft_vocab", vocab), ("full_head", None)):
                model.set_draft_vocab(setting)
                prefill(engine, 1, CONTEXT_LEN, torch.Generator().manual_seed(round_number))
                entry = bench_sd_overhead(engine, chains[0], STEPS, WARMUP)
                engine.reset()
                best[name] = min(best[name], entry["drafter_ms"] / strategy.depth)
    finally:
        model.set_draft_vocab(vocab)
        engine.max_num_seqs = saved_batch
    return {
        "strategy": chains[0],
        "draft_vocab_size": len(vocab),
        "us_per_draft_token_draft_vocab": round(1e3 * best["draft_vocab"], 2),
        "us_per_draft_token_full_head": round(1e3 * best["full_head"], 2),
        "ratio": round(best["draft_vocab"] / best["full_head"], 3),
    }


def print_drafting_cost(cost: dict | None) -> None:
    if cost is None:
        return
    print(
        f"drafting cost per draft token ({cost['strategy']}, batch 1): {cost['us_per_draft_token_draft_vocab']:.0f} us "
        f"over the draft vocabulary ({cost['draft_vocab_size']} tokens) vs {cost['us_per_draft_token_full_head']:.0f} "
        f"us over the full head: {cost['ratio']:.2f}x",
        flush=True,
    )
