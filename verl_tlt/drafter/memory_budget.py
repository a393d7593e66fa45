"""The most memory a drafter worker may hold, and what it does when it holds more.

TLT must fit wherever the same run with TLT off fits: its drafter workers share the node with verl's actor and the
rollout servers, and on a small machine the node's memory monitor kills the largest process when memory runs out,
which must never be the RL run. So each worker checks its resident memory before every optimizer step of a burst
(a few microseconds) and before it starts one: over its budget, the burst ends at that step, the worker frees what
it can (collected garbage, the CUDA cache, its oldest buffered samples) and training resumes in a later burst once
it is back under. An out-of-memory error inside a burst is handled the same way.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import psutil
import torch

GIB = 1 << 30
# Without an explicit budget a worker may hold this share of the node's memory: room for the toy's and SmolLM2's
# workers (0.6-1.4 GiB each, docs/benchmarks.md) on a 24 GiB machine; a runaway buffer or a leak still stops.
DEFAULT_NODE_SHARE = 0.15


def budget_bytes(budget_gib: float, node_bytes: int | None = None) -> int:
    """The budget in bytes: `budget_gib`, or DEFAULT_NODE_SHARE of the node's memory when it is 0."""
    if budget_gib > 0:
        return int(budget_gib * GIB)
    total = node_bytes if node_bytes is not None else psutil.virtual_memory().total
    return int(DEFAULT_NODE_SHARE * total)


def resident_bytes() -> int:
    """This process's resident memory."""
    return psutil.Process().memory_info().rss


class MemoryBudget:
    """`exceeded()` tells whether the process holds more than `limit` bytes (`resident` measures it)."""

    def __init__(self, limit: int, resident: Callable[[], int] = resident_bytes):
        self.limit, self.resident = limit, resident

    def exceeded(self) -> bool:
        return self.resident() > self.limit

    def describe(self) -> str:
        return f"{self.resident() / GIB:.2f} GiB resident, budget {self.limit / GIB:.2f} GiB"


def free_caches() -> None:
    """What a process can give back without losing state: collectable garbage and the CUDA caching allocator's
    unused blocks."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def is_out_of_memory(error: BaseException) -> bool:
    """A host or device out-of-memory error (CUDA's, and the allocator's RuntimeError text on other backends)."""
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()
