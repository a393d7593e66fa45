"""Pinning a process to cores and the idle scheduling class, each checked in a child process (the test process keeps
its own mask and class)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling only")

CHILD = """
import os, sys, threading, time
from verl_tlt.cpu_affinity import available_cores, pin_process, use_idle_class
started = threading.Event()
threading.Thread(target=lambda: (started.set(), time.sleep(5)), daemon=True).start()  # a thread that runs already
started.wait()
core = available_cores()[0]
assert pin_process([core]) == [core]
assert use_idle_class() is True
late = []
threading.Thread(target=lambda: late.append((os.sched_getaffinity(0), os.sched_getscheduler(0)))).start()
time.sleep(0.2)
threads = [int(t) for t in os.listdir("/proc/self/task")]
assert all(os.sched_getaffinity(t) == {core} for t in threads), "a thread kept its old mask"
assert all(os.sched_getscheduler(t) == os.SCHED_IDLE for t in threads), "a thread kept its class"
assert late == [({core}, os.SCHED_IDLE)], late  # a thread started later inherits both
print("ok")
"""


def test_every_thread_is_pinned_and_idle_class_and_later_threads_inherit_both():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_pinning_to_no_core_or_a_missing_one_is_refused():
    from verl_tlt.cpu_affinity import pin_process

    with pytest.raises(ValueError, match="at least one core"):
        pin_process([])
    with pytest.raises(ValueError, match="this machine has cores"):
        pin_process([os.cpu_count() + 7])
