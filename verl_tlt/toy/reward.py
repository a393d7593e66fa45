"""verl custom reward function for the toy tasks: `reward.custom_reward_function.path=<this file>`.

verl imports this file by path in its reward workers, so it imports only the pure-Python task module (no
torch, transformers or verl). The scoring rule is documented in `verl_tlt.toy.task`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_tlt.toy.task import DATA_SOURCE, Problem, score


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> float:
    """Score one decoded response; partial credit needs `extra_info["n"]` and `["d"]` (the parquet has them)."""
    if data_source != DATA_SOURCE:
        raise ValueError(f"verl_tlt.toy.reward scores data_source {DATA_SOURCE!r} only, got {data_source!r}")
    problem = None
    if extra_info is not None and extra_info.get("n") is not None and extra_info.get("d") is not None:
        problem = Problem.from_nd(int(extra_info["n"]), int(extra_info["d"]))
    return score(solution_str, ground_truth, problem)
