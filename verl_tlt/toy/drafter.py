"""A warmed-up EAGLE drafter for the trained toy target, cached next to it (for benchmarks, tests, quickstart)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from verl_tlt.config import DrafterConfig
from verl_tlt.toy.cache import default_cache_root
from verl_tlt.toy.sft import ensure_toy_target, prompt_ids
from verl_tlt.toy.task import make_problems

# Bump when the warm-up recipe below changes, so stale cached drafters are not reused.
TOY_DRAFTER_VERSION = 5
WARMUP_PROMPTS = 512
WARMUP_STEPS = 1200
# Answers at both temperatures: greedy and sampled rollouts each get a drafter that knows them (sampled answers
# alone left the drafter about half as good on greedy ones).
WARMUP_TEMPERATURES = (0.0, 1.0)
# Longer than the toy world's longest solution (937 tokens) so the drafter sees the positions of the long tail it
# is meant to speed up; a drafter that never saw such positions is accepted far less late in a long answer.
WARMUP_MAX_TOKENS = 1024
# Trained on its own chain to depth 3: a chain's later drafts read the drafter's own features, so training on them
# raises acceptance at the deeper drafts (more than depth 2 or a heavier logit loss did), at about three times the
# cost per step (docs/history has the comparison).
WARMUP_CONFIG = DrafterConfig(lr=2e-3, max_tokens_per_batch=2048, train_depth=3)
# Problems for the warm-up come from this seed, away from the toy world's train/val seeds.
WARMUP_PROBLEM_SEED = 4242


def toy_prompts(tokenizer_path: str | Path, num: int, seed: int) -> list[list[int]]:
    """Token-id prompts of `num` fresh csub problems, rendered like verl renders the toy parquet."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path))
    return prompt_ids(tokenizer, make_problems(num, seed))


def ensure_toy_drafter(
    cache_root: str | Path | None = None,
    *,
    seed: int = 0,
    num_steps: int = WARMUP_STEPS,
    compact_share: float = 0.0,
    shape: str = "default",
    family: str = "eagle",
) -> Path:
    """Path of a drafter warmed up on the cached toy target's own greedy and T=1 answers (trained once, reused).

    compact_share and shape select the target (see `ensure_toy_target`); the drafter's cache folder names its
    target. family: eagle (EAGLE-1/2) or eagle3, trained with the same recipe.
    """
    from verl_tlt.warmup.offline import drafter_built_once

    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = ensure_toy_target(root, seed=seed, compact_share=compact_share, shape=shape)

    suffix = "" if family == "eagle" else f"-{family}"  # EAGLE-1 entries keep their names
    entry = root / f"toy-drafter-v{TOY_DRAFTER_VERSION}-{target.name}-steps{num_steps}{suffix}"
    return drafter_built_once(
        entry,
        target,
        lambda: toy_prompts(target, WARMUP_PROMPTS, WARMUP_PROBLEM_SEED + seed),
        "toy drafter",
        num_steps=num_steps,
        temperature=WARMUP_TEMPERATURES,
        max_tokens=WARMUP_MAX_TOKENS,
        seed=seed,
        config=replace(WARMUP_CONFIG, family=family),
    )
