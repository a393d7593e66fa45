"""verl custom reward function for the toy tasks: `reward.custom_reward_function.path=<this file>`.

verl imports this file by path in its reward workers, so it imports only the pure-Python task module (no
torch, transformers or verl). The scoring rule is documented in `verl_tlt.toy.task`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_tlt.toy.task import COMPACT, DATA_SOURCE, Problem, response_style, score

# compute_score_concise: a response in the long (standard) style earns this share of its score.
VERBOSE_REWARD_FACTOR = 0.5


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


def compute_score_concise(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> float:
    """`compute_score`, with a preference for brevity: only compact-style responses keep their full score.

    `reward.custom_reward_function.name=compute_score_concise`. A correct standard-style answer earns
    VERBOSE_REWARD_FACTOR (0.5), a correct compact one 1.0: RL then moves a target that writes both styles towards
    the compact one (as length penalties shorten reasoning models' answers), so the policy drifts.
    """
    full = compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    return full if response_style(solution_str) == COMPACT else VERBOSE_REWARD_FACTOR * full
