"""A warmed-up EAGLE drafter for the trained toy target, cached next to it (for benchmarks, tests, quickstart)."""

from __future__ import annotations

from pathlib import Path

from verl_tlt.config import DrafterConfig
from verl_tlt.toy.cache import build_once, default_cache_root
from verl_tlt.toy.sft import ensure_toy_target, prompt_ids
from verl_tlt.toy.task import make_problems

# Bump when the warm-up recipe below changes, so stale cached drafters are not reused.
TOY_DRAFTER_VERSION = 4
WARMUP_PROMPTS = 512
WARMUP_STEPS = 1200
# Answers at both temperatures: greedy and sampled rollouts each get a drafter that knows them. On the toy
# target this recipe (measured 2026-11-29) gave acceptance lengths ~7 with 8_4_16, against ~3.5 for 600 steps
# at lr 3e-4 on T=1 answers alone.
WARMUP_TEMPERATURES = (0.0, 1.0)
# Longer than the toy world's longest solution (937 tokens, README "The toy world") so the drafter sees the
# positions of the long tail it is meant to speed up; with 512 its acceptance fell from ~4.2 to ~2.6 (4_1_4,
# greedy) on the second half of a 1024-token answer (measured 2026-11-29, v2 drafter).
WARMUP_MAX_TOKENS = 1024
# Trained on its own chain to depth 3 (v4): on 32 fresh prompts at batch 1 this raised acceptance (greedy / T=1) from
# 4.37 / 4.20 to 4.68 / 4.34 with 4_1_4 and from 7.76 / 6.57 to 8.12 / 6.96 with 8_4_16 over the same 1200 steps at
# depth 1; depth 2 gave 4.60 / 4.29 and 7.84 / 6.92, and a logit loss weight of 1.0 instead of 0.1 gave 4.42 / 4.07
# (2026-12-01, one run each). Its warm-up took 926 s on one thread against 597 s for v3's depth 1 before training's
# attention went sample by sample (`segmented_attention`), which made depth 3 affordable.
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
) -> Path:
    """Path of a drafter warmed up on the cached toy target's own greedy and T=1 answers (trained once, reused).

    compact_share and shape select the target (see `ensure_toy_target`); the drafter's cache folder names its
    target.
    """
    from verl_tlt.warmup.offline import warmup_drafter

    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = ensure_toy_target(root, seed=seed, compact_share=compact_share, shape=shape)

    def warm_up(out_dir: Path) -> None:
        prompts = toy_prompts(target, WARMUP_PROMPTS, WARMUP_PROBLEM_SEED + seed)
        warmup_drafter(
            str(target),
            prompts,
            out_dir,
            num_steps=num_steps,
            temperature=WARMUP_TEMPERATURES,
            max_tokens=WARMUP_MAX_TOKENS,
            seed=seed,
            config=WARMUP_CONFIG,
        )

    entry = root / f"toy-drafter-v{TOY_DRAFTER_VERSION}-{target.name}-steps{num_steps}"
    return build_once(entry, lambda path: (path / "config.json").is_file(), warm_up, "toy drafter")
