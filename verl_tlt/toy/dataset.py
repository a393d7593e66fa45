"""Write `csub` problems in verl's RL parquet format (one row per prompt).

Columns are the ones verl's RLHFDataset and reward managers read: `data_source`,
`prompt` (chat messages, rendered by the tokenizer's chat template), `ability`, `reward_model` (with the
`ground_truth` remainder as a string) and `extra_info`. `extra_info` also carries `n` and `d`, because verl
passes `extra_info` to the reward function and the partial-credit rule needs the problem, not just the answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from verl_tlt.toy.task import DATA_SOURCE, Problem, prompt_text

ABILITY = "math"


def to_row(problem: Problem, split: str, index: int) -> dict[str, Any]:
    """One parquet row for `problem`."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": prompt_text(problem)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": str(problem.answer)},
        "extra_info": {
            "split": split,
            "index": index,
            "num_steps": problem.num_steps,
            "n": problem.n,
            "d": problem.d,
        },
    }


def write_parquet(problems: list[Problem], path: str | Path, split: str) -> Path:
    """Write `problems` as a verl RL parquet file at `path` (parent folders are created); returns the path."""
    if not problems:
        raise ValueError(f"refusing to write an empty {split!r} split to {path}: verl cannot train on it")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame([to_row(problem, split, index) for index, problem in enumerate(problems)])
    frame.to_parquet(path, index=False)
    return path
