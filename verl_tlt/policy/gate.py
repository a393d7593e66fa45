"""Whether a decode step of a given batch size may speculate, and which bucket's arms then compete.

This is TLT's gate, in one place for every backend (torch engine, vLLM scheduler and stat logger, simulator,
benchmarks): a rollout engine speculates while 1 <= running requests <= ``threshold`` (the long tail), and decodes
plainly above it. Below the threshold, batch sizes fall into buckets (lower bounds ascending from 1); each bucket
learns its own best arm, an SD strategy or ``PLAIN`` (plain decoding, an arm of the buckets starting at
``plain_arm_min_batch`` or above).

Pure: no torch, no config import (``config.SpeculativeConfig`` validates and defaults its buckets with the helpers
here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The arm (and step label) of plain decoding.
PLAIN = "plain"
# Lower bounds of the batch-size buckets: fine at small sizes, where the SD speedup changes fastest with the batch.
DEFAULT_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24)


def default_buckets(threshold: int) -> tuple[int, ...]:
    """The default buckets that a gate at `threshold` can reach."""
    return tuple(lower for lower in DEFAULT_BUCKETS if lower <= threshold)


def bucket_problem(buckets: Sequence[int], threshold: int) -> str | None:
    """Why `buckets` cannot serve a gate at `threshold` (None: they can)."""
    lowers = list(buckets)
    if not lowers or lowers[0] != 1 or lowers != sorted(set(lowers)):
        return f"buckets must ascend strictly from 1, got {lowers}"
    if lowers[-1] > threshold:
        return f"buckets must stay <= threshold={threshold}, got {lowers}"
    return None


@dataclass(frozen=True)
class SpeculationGate:
    threshold: int
    buckets: tuple[int, ...] = ()  # () = the default buckets up to the threshold

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise ValueError(f"the speculation threshold must be >= 0 (0 = never speculate), got {self.threshold}")
        object.__setattr__(self, "buckets", tuple(self.buckets) or default_buckets(max(self.threshold, 1)))
        problem = bucket_problem(self.buckets, max(self.threshold, 1))
        if problem:
            raise ValueError(problem)

    def speculates(self, batch_size: int) -> bool:
        """Whether a step of `batch_size` running requests may speculate: the threshold comparison of the project."""
        return 1 <= batch_size <= self.threshold

    def bucket_of(self, batch_size: int) -> int | None:
        """Lower bound of the bucket of `batch_size`, or None where the gate decodes plainly."""
        if not self.speculates(batch_size):
            return None
        return max(lower for lower in self.buckets if lower <= batch_size)

    def speculative_ranges(self, max_batch: int) -> list[tuple[int, int, bool]]:
        """Batch sizes 1..max_batch as inclusive (first, last, speculates) ranges, for schedules that take ranges
        (vLLM's per-batch-size K)."""
        last_sd = min(self.threshold, max_batch)
        ranges = [(1, last_sd, True)] if last_sd >= 1 else []
        if max_batch > last_sd:
            ranges.append((last_sd + 1, max_batch, False))
        return ranges

    def arm_names(self, bucket: int, strategies: Sequence[str], plain_arm_min_batch: int) -> list[str]:
        """The arms of `bucket`: every strategy, and PLAIN where the bucket starts at `plain_arm_min_batch` or
        above."""
        return list(strategies) + ([PLAIN] if bucket >= plain_arm_min_batch else [])
