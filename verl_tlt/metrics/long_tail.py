"""The shape of a rollout's long tail: when responses finish and how long they are.

Inputs are per-response finish times (seconds since the rollout started) and response lengths in tokens.
TLT exists because the last few responses keep the rollout running long after most have finished; these numbers
show how much of the rollout that tail is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

PREFIX = "tlt/tail"


def long_tail_metrics(finish_seconds: Sequence[float], response_lengths: Sequence[int]) -> dict[str, float]:
    """`tlt/tail/*`: time until 50/90/100% of responses finished, response-length p50/p90/max, and the share of
    the rollout spent after 90% had finished. Empty input gives an empty dict (nothing to describe)."""
    if len(finish_seconds) != len(response_lengths):
        raise ValueError(f"{len(finish_seconds)} finish times vs {len(response_lengths)} response lengths")
    if not finish_seconds:
        return {}
    times = sorted(finish_seconds)
    lengths = sorted(response_lengths)
    end = times[-1]
    at_90 = nearest_rank(times, 0.9)
    return {
        f"{PREFIX}/time_to_50pct_s": nearest_rank(times, 0.5),
        f"{PREFIX}/time_to_90pct_s": at_90,
        f"{PREFIX}/time_to_100pct_s": end,
        f"{PREFIX}/last_10pct_share": (end - at_90) / end if end > 0 else 0.0,
        f"{PREFIX}/response_len_p50": float(nearest_rank(lengths, 0.5)),
        f"{PREFIX}/response_len_p90": float(nearest_rank(lengths, 0.9)),
        f"{PREFIX}/response_len_max": float(lengths[-1]),
    }


def nearest_rank(sorted_values: Sequence[float], fraction: float) -> float:
    """The smallest value with at least `fraction` of the values at or below it (nearest-rank percentile)."""
    index = max(math.ceil(fraction * len(sorted_values)) - 1, 0)
    return sorted_values[index]
