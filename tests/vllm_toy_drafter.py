"""The warmed-up toy drafter the vLLM tier drafts with.

A shorter warm-up than the benches' default (1200 steps): on an empty cache the vLLM tier trains it first, and the
full recipe cost about 3 of the test command's 35 minutes; 400 steps still give the acceptance the tests ask of a
warm drafter (>= 3 at K=4) with room to spare.
"""

from __future__ import annotations

from pathlib import Path

VLLM_TIER_DRAFTER_STEPS = 400


def vllm_tier_drafter() -> Path:
    from verl_tlt.toy.drafter import ensure_toy_drafter

    return ensure_toy_drafter(num_steps=VLLM_TIER_DRAFTER_STEPS)
