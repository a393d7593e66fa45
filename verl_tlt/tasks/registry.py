"""The real reasoning tasks the project trains on: reasoning-gym generators at a difficulty a small model can learn.

Each task is one reasoning-gym dataset with a fixed configuration. GRPO learns only from groups whose rewards
differ, so a task is useful when the base model solves some of its problems but not all. The configurations here
were chosen by `verl-tlt tasks eval` on SmolLM2-135M-Instruct (docs/real_models.md has its pass rates); the
word problems stay for the long tail of their answers, though the base model solves none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DATA_SOURCE_PREFIX = "reasoning_gym/"


@dataclass(frozen=True)
class Task:
    name: str  # the reasoning-gym dataset name
    config: dict[str, Any] = field(default_factory=dict)  # its keyword arguments (difficulty)
    numeric: bool = True  # the answer is one number: a response without answer tags is read by its last number

    @property
    def data_source(self) -> str:
        return DATA_SOURCE_PREFIX + self.name

    def config_json(self) -> str:
        return json.dumps(self.config, sort_keys=True)


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        # One addition or subtraction of one-digit numbers: "State the final answer to ...: 7 - 5 =". With 2-3 terms of
        # 1-2 digits SmolLM2 passed 1 of 8 greedily; here 7 of 16 (docs/real_models.md).
        Task("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
        # One of the four operations on one-digit numbers: harder for the model (more often wrong), so groups differ.
        Task("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
        # GSM8K-style word problems (templates from GSM8K): a long tail of step-by-step answers.
        Task("gsm_symbolic", {}),
    )
}
DEFAULT_TASKS = tuple(TASKS)


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))} (`verl-tlt tasks list`)")
    return TASKS[name]


def task_of_data_source(data_source: str) -> str:
    """`reasoning_gym/chain_sum` -> `chain_sum`; any other data source is refused, naming it."""
    if not data_source.startswith(DATA_SOURCE_PREFIX):
        raise ValueError(
            f"data_source {data_source!r} is not a reasoning-gym task of verl-tlt (expected {DATA_SOURCE_PREFIX}NAME; "
            "write the data with `verl-tlt tasks write`)"
        )
    return data_source[len(DATA_SOURCE_PREFIX) :]
