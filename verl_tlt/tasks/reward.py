"""verl custom reward function for the reasoning-gym tasks: `reward.custom_reward_function.path=<this file>`.

verl imports this file by path in its reward workers, so it imports only the task modules (reasoning-gym, no
torch, transformers or verl). The rule is `verl_tlt.tasks.scoring`'s: 1.0 for a fully correct answer, else 0.0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_tlt.tasks.registry import task_of_data_source
from verl_tlt.tasks.scoring import score_response

ROW_KEYS = ("seed", "size", "index")  # extra_info keys `verl-tlt tasks write` puts in every row


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> float:
    """Score one decoded response on the problem its row names."""
    task_name = task_of_data_source(data_source)
    missing = [key for key in ROW_KEYS if extra_info is None or extra_info.get(key) is None]
    if missing:
        raise ValueError(
            f"the {data_source} row has no extra_info {missing}: write the data with `verl-tlt tasks write`"
        )
    return score_response(
        task_name,
        int(extra_info["seed"]),
        int(extra_info["size"]),
        int(extra_info["index"]),
        solution_str,
        str(ground_truth),
    )
