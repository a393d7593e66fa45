"""Run a function in another thread with the intra-op thread count its starter asked for.

With OpenMP (torch's stock CPU builds), `torch.set_num_threads` sizes the calling thread's OpenMP team only. A
thread started later runs its parallel regions with the process default (OMP_NUM_THREADS, else one thread per
core), although `torch.get_num_threads()` there still reports the starter's value. Measured on the 2-core dev
machine: after `set_num_threads(1)` in the main thread, matmuls in a new thread kept both cores busy. So every
thread that runs torch work for us (the rollout server's engine loop, spot training) sets the count itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def with_torch_threads(target: Callable[..., T], num_threads: int | None = None) -> Callable[..., T]:
    """`target`, wrapped so that the thread running it first sets torch's intra-op thread count.

    num_threads: the count to set; None = the caller's count now (so a thread started here inherits it).
    """
    count = torch.get_num_threads() if num_threads is None else int(num_threads)
    if count < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")

    def run(*args, **kwargs) -> T:
        torch.set_num_threads(count)
        return target(*args, **kwargs)

    return run
