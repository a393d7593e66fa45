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

GIB = 1024**3

Result = TypeVar("Result")


def run_apart(function: Callable[..., Result], *args: Any) -> Result:
    """`function(*args)` in a fresh child process (spawned: no copy of this one's memory); its result, or its error.

    The child logs as this process does (its progress lines show, in the same format), and is gone, with everything
    it held, on return. `function` and its arguments and result must pickle (a module-level function, paths,
    dataclasses).
    """
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context, initializer=_log_like, initargs=_logging_here()) as pool:
        return pool.submit(function, *args).result()


def _logging_here() -> tuple[int, str | None, str | None]:
    """This process's log level, and the format and date format of its root handler (None: logging's defaults)."""
    root = logging.getLogger()
    formatter = next((handler.formatter for handler in root.handlers if handler.formatter is not None), None)
    if formatter is None:
        return root.getEffectiveLevel(), None, None
    return root.getEffectiveLevel(), formatter._style._fmt, formatter.datefmt


def _log_like(level: int, format: str | None, datefmt: str | None) -> None:
    logging.basicConfig(level=level, format=format, datefmt=datefmt)


def own_memory() -> dict[str, float]:
    """This process's resident memory now and its peak over its life (GiB): what the quickstart itself holds."""
    # ru_maxrss is in KiB on Linux (bytes on macOS, where the quickstart is not run).
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "rss_gib": round(psutil.Process().memory_info().rss / GIB, 3),
        "peak_rss_gib": round(peak_kib * 1024 / GIB, 3),
    }
