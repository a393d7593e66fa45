"""Run a quickstart stage in a child process, so that what it held goes back to the machine before the verl runs.

Building the toy target or a real model's drafter loads models, answers thousands of prompts and trains: the
process that did it keeps gigabytes resident afterwards (freed tensors stay in the allocator's arenas). The verl
runs that follow need the whole machine (a TLT run of SmolLM2-135M peaks at 22 of 24 GiB on 2 cores), so the
quickstart builds its inputs in a spawned child and keeps only the paths it returns.
"""

from __future__ import annotations

import logging
import multiprocessing
import resource
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

import psutil

LOG_FORMAT = "%(asctime)s [quickstart] %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"
GIB = 1024**3

Result = TypeVar("Result")


def run_apart(function: Callable[..., Result], *args: Any) -> Result:
    """`function(*args)` in a fresh child process (spawned: no copy of this one's memory); its result, or its error.

    The child logs like the quickstart (its progress lines show), and is gone, with everything it held, on return.
    `function` and its arguments and result must pickle (a module-level function, paths, dataclasses).
    """
    level = logging.getLogger().getEffectiveLevel()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context, initializer=_configure_logging, initargs=(level,)) as pool:
        return pool.submit(function, *args).result()


def _configure_logging(level: int) -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT, datefmt=LOG_DATE_FORMAT)


def own_memory() -> dict[str, float]:
    """This process's resident memory now and its peak over its life (GiB): what the quickstart itself holds."""
    # ru_maxrss is in KiB on Linux (bytes on macOS, where the quickstart is not run).
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "rss_gib": round(psutil.Process().memory_info().rss / GIB, 3),
        "peak_rss_gib": round(peak_kib * 1024 / GIB, 3),
    }
