"""The real reasoning tasks the project trains on: reasoning-gym generators at a difficulty a small model can learn.

Each task is one reasoning-gym dataset with a fixed configuration. GRPO learns only from groups whose rewards
differ, so a task is useful when the base model solves some of its problems but not all. The configurations here
are a first choice from what was seen of SmolLM2-135M-Instruct (one right of 16 easy basic_arithmetic problems, none
of 8 gsm_symbolic, greedy); `verl-tlt tasks eval` measures them, and they are to be tuned by it.
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
        # One operation on one- or two-digit numbers: "State the final answer to ...: 7 + 15 =".
        Task("chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
        # Two or three terms with brackets and all four operations: harder, so rewards in a group differ.
        Task("basic_arithmetic", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
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
