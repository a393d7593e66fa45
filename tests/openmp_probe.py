"""The OpenMP team size of the calling thread, read from the OpenMP runtime torch loaded (tests only).

`torch.get_num_threads()` cannot show a thread's own team size (it reports the count last set anywhere), so tests
that check per-thread settings ask the runtime directly. Skips where torch is not built with a known OpenMP.
"""

from __future__ import annotations

import ctypes
import os

import pytest


def openmp_max_threads_probe():
    import torch  # noqa: F401  (loads the runtime)

    with open("/proc/self/maps") as maps:
        paths = {word for line in maps for word in line.split() if "libgomp" in word or "libiomp" in word}
    if not paths:
        pytest.skip("torch here is not linked against libgomp/libiomp")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: every thread's default team is one thread already, nothing to tell apart")
    return ctypes.CDLL(sorted(paths)[0]).omp_get_max_threads
