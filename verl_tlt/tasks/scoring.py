"""A response's reward on a reasoning-gym problem: the task's own scorer, made binary for GRPO.

reasoning-gym's scorers give a wrong but well-formed answer a small positive score (0.01 on gsm_symbolic, 0.05 on
countdown). GRPO divides each group's advantages by the group's reward spread, so in a group where every answer is
wrong those crumbs would become full-sized advantages for noise; a reward is therefore 1.0 when the scorer
accepts the answer in full and 0.0 otherwise.
"""

from __future__ import annotations

from verl_tlt.tasks.answers import extract_answer
from verl_tlt.tasks.problems import entry_of
from verl_tlt.tasks.registry import get_task

FULL_SCORE = 1.0


def score_response(task_name: str, seed: int, size: int, index: int, response: str, ground_truth: str) -> float:
    """1.0 if the task's scorer gives the response's answer full marks, else 0.0."""
    task = get_task(task_name)
    dataset, entry = entry_of(task_name, seed, size, index)
    if str(entry["answer"]) != ground_truth:
        raise ValueError(
            f"{task_name} problem {index} (seed {seed}, size {size}) regenerates with answer {entry['answer']!r}, "
            f"not the row's ground truth {ground_truth!r}: the parquet was written by another reasoning-gym "
            "version or configuration; rewrite it with `verl-tlt tasks write`"
        )
    answer = extract_answer(response, task.numeric)
    if answer is None:
        return 0.0
    return 1.0 if dataset.score_answer(answer, entry) >= FULL_SCORE else 0.0
