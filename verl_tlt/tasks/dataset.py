"""Write reasoning-gym problems in verl's RL parquet format (one row per prompt), train and validation splits.

The columns are those verl's RLHFDataset and reward managers read (`data_source`, `prompt` as chat messages,
`ability`, `reward_model.ground_truth`, `extra_info`); `extra_info` carries the seed, size and index that find the
problem again for its scorer (`verl_tlt.tasks.problems`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from verl_tlt.tasks.answers import chat_prompt
from verl_tlt.tasks.problems import Problem, generate
from verl_tlt.tasks.registry import get_task

ABILITY = "reasoning"
VAL_SEED_OFFSET = 1_000_003  # validation problems come from another seed, so they are not the training ones


def to_row(problem: Problem, split: str) -> dict[str, Any]:
    return {
        "data_source": get_task(problem.task).data_source,
        "prompt": chat_prompt(problem.question),
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": problem.answer},
        "extra_info": {
            "split": split,
            "task": problem.task,
            "seed": problem.seed,
            "size": problem.size,
            "index": problem.index,
        },
    }


def mixed_problems(tasks: Sequence[str], per_task: int, seed: int) -> list[Problem]:
    """`per_task` problems of each task, interleaved (task 1, task 2, ..., task 1, ...) so any prefix is mixed."""
    per = [generate(task, seed + number, per_task) for number, task in enumerate(tasks)]
    return [problems[i] for i in range(per_task) for problems in per]


def write_splits(out_dir: str | Path, tasks: Sequence[str], train: int, val: int, seed: int) -> dict[str, Path]:
    """`train.parquet` and `val.parquet` under `out_dir` (`train` and `val` problems per task)."""
    if not tasks:
        raise ValueError("no tasks given: name at least one (`verl-tlt tasks list`)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, per_task, split_seed in (("train", train, seed), ("val", val, seed + VAL_SEED_OFFSET)):
        rows = [to_row(problem, split) for problem in mixed_problems(tasks, per_task, split_seed)]
        paths[split] = out_dir / f"{split}.parquet"
        pd.DataFrame(rows).to_parquet(paths[split], index=False)
    return paths


def longest_prompt(model_dir: str | Path, parquet: str | Path, step: int) -> int:
    """The longest chat-rendered prompt in `parquet` (data.max_prompt_length for it), in tokens of the model at
    `model_dir`, rounded up to a multiple of `step` so that a job's padding does not hinge on one long question."""
    import math

    from transformers import AutoTokenizer

    from verl_tlt.chat import chat_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    lengths = [len(chat_prompt_ids(tokenizer, messages)) for messages in pd.read_parquet(parquet)["prompt"]]
    return step * math.ceil(max(lengths) / step)


# Prompt lengths are rounded up to this, so a job's padding does not hinge on one long question.
PROMPT_LENGTH_STEP = 32


def grpo_task_files(model_dir: str | Path, out_dir: str | Path, num_prompts: int, seed: int = 0) -> dict[str, Any]:
    """Train and validation parquet for a GRPO job that draws `num_prompts` prompts (the default tasks, interleaved;
    one validation problem per task), and data.max_prompt_length for them in the model's tokens: keys train, val,
    max_prompt_length."""
    import math

    from verl_tlt.tasks.registry import DEFAULT_TASKS

    per_task = math.ceil(num_prompts / len(DEFAULT_TASKS))
    files = write_splits(out_dir, DEFAULT_TASKS, train=per_task, val=1, seed=seed)
    return {**files, "max_prompt_length": longest_prompt(model_dir, files["train"], PROMPT_LENGTH_STEP)}
