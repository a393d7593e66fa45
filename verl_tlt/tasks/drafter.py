"""A warmed-up EAGLE drafter for a real model on the real tasks, cached next to the model (benchmarks, tests,
quickstart): the real-model twin of `verl_tlt.toy.drafter`.

The drafter learns from the model's own greedy and T=1 answers to reasoning-gym problems asked as the RL data asks
them (the same chat prompt and template), from a problem seed apart from the train and validation splits'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from verl_tlt.chat import chat_prompt_ids
from verl_tlt.config import DrafterConfig
from verl_tlt.files import default_cache_root
from verl_tlt.models.prepare import ensure_model
from verl_tlt.tasks.answers import chat_prompt
from verl_tlt.tasks.dataset import mixed_problems
from verl_tlt.tasks.registry import DEFAULT_TASKS
from verl_tlt.warmup.recipe import WARMUP_GRAD_CLIP_NORM, WARMUP_LR

# Bump when the recipe below changes, so stale cached drafters are not reused.
TASK_DRAFTER_VERSION = 2
DEFAULT_MODEL = "smollm2-135m"
WARMUP_PROBLEMS_PER_TASK = 96
# About 10 minutes of training on 2 cores (SmolLM2, docs/benchmarks.md), after about 6 of collection.
WARMUP_STEPS = 600
WARMUP_TEMPERATURES = (0.0, 1.0)
# The tasks' answers: p50 34-233 tokens, p90 at the 256 cap (docs/real_models.md); the cap keeps the tail's
# positions in the data without letting a few runaway samples fill it.
WARMUP_MAX_TOKENS = 256
# The warm-up's optimizer settings with tlt.drafter's recipe otherwise (sparse labels, a draft vocabulary, 4096
# tokens a step, depth 1).
WARMUP_CONFIG = DrafterConfig(lr=WARMUP_LR, grad_clip_norm=WARMUP_GRAD_CLIP_NORM)
# Problems for the warm-up come from this seed, away from `verl-tlt tasks write`'s train (0) and validation seeds.
WARMUP_PROBLEM_SEED = 4242


def task_prompts(model_path: str | Path, per_task: int, seed: int, tasks: Sequence[str] = DEFAULT_TASKS):
    """Token-id chat prompts of `per_task` fresh problems of each task, interleaved, as verl renders the parquet."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    return [chat_prompt_ids(tokenizer, chat_prompt(p.question)) for p in mixed_problems(tasks, per_task, seed)]


def ensure_task_drafter(
    model: str = DEFAULT_MODEL,
    cache_root: str | Path | None = None,
    *,
    seed: int = 0,
    num_steps: int = WARMUP_STEPS,
    per_task: int = WARMUP_PROBLEMS_PER_TASK,
    family: str = "eagle",
) -> Path:
    """Path of a drafter of `family` (eagle or eagle3) warmed up on the prepared model's own answers to the real
    tasks (trained once, reused)."""
    from verl_tlt.warmup.offline import drafter_built_once

    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = ensure_model(model, root)

    suffix = "" if family == "eagle" else f"-{family}"  # EAGLE-1 entries keep their names
    entry = root / f"task-drafter-v{TASK_DRAFTER_VERSION}-{target.name}-p{per_task}-steps{num_steps}-seed{seed}{suffix}"
    return drafter_built_once(
        entry,
        target,
        lambda: task_prompts(target, per_task, WARMUP_PROBLEM_SEED + seed),
        f"{model} drafter",
        num_steps=num_steps,
        temperature=WARMUP_TEMPERATURES,
        max_tokens=WARMUP_MAX_TOKENS,
        seed=seed,
        config=replace(WARMUP_CONFIG, family=family),
    )
