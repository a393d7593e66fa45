"""Pin this process to a set of CPU cores (the rollout server of a CPU replica, and its drafter worker, on the same),
and put it in the idle scheduling class (a drafter worker: the cycles nobody else wants).

`os.sched_setaffinity(0, ...)` pins the calling thread only (on Linux, pid 0 is the caller's thread), and the
threads a process already runs (Ray's, torch's OpenMP team) keep their own mask; so every thread of the process is
pinned, and the threads it starts later inherit the mask from their starter.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

logger = logging.getLogger(__name__)


def available_cores() -> list[int]:
    """The cores this process may run on now, ascending (all of the machine's where affinity is not supported)."""
    if not hasattr(os, "sched_getaffinity"):
        return list(range(os.cpu_count() or 1))
    return sorted(os.sched_getaffinity(0))


def pin_process(cores: Sequence[int]) -> list[int]:
    """Pin every thread of this process to `cores`; the cores pinned to (empty where the OS cannot pin: then
    nothing changed, which is logged). Raises ValueError for an empty set or cores this machine lacks."""
    wanted = sorted({int(core) for core in cores})
    if not wanted:
        raise ValueError("pin_process needs at least one core")
    if not hasattr(os, "sched_setaffinity"):
        logger.warning("This OS cannot pin processes to cores; %d runs unpinned", os.getpid())
        return []
    missing = set(wanted) - set(range(os.cpu_count() or 1))
    if missing:
        raise ValueError(f"cannot pin to cores {sorted(missing)}: this machine has cores 0-{(os.cpu_count() or 1) - 1}")
    for thread_id in _thread_ids():
        try:
            os.sched_setaffinity(thread_id, wanted)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile, or one of another user
            continue
    os.sched_setaffinity(0, wanted)
    return wanted


def _thread_ids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:  # no procfs: the calling thread only
        return []


def use_idle_class() -> bool:
    """Put every thread of this process under SCHED_IDLE (Linux): it runs only when nothing else wants the core, and
    the kernel's wake-up placement treats a core running only idle-class work as free. True if it took effect
    (False, logged, where the OS has no such class or refuses)."""
    if not hasattr(os, "SCHED_IDLE"):
        logger.warning("This OS has no idle scheduling class; process %d keeps its niceness only", os.getpid())
        return False
    try:
        for thread_id in [*_thread_ids(), 0]:
            try:
                os.sched_setscheduler(thread_id, os.SCHED_IDLE, os.sched_param(0))
            except ProcessLookupError:  # a thread that ended meanwhile
                continue
    except PermissionError as error:
        logger.warning("Cannot move process %d to the idle scheduling class (%s); niceness only", os.getpid(), error)
        return False
    return True
