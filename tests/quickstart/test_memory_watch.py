"""Per-component peak memory of a job's process tree: which component a process is, the peaks over samples, the
table, and a real sample of a process tree (a child that holds a known allocation)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from verl_tlt.quickstart.memory_watch import (
    DRIVER,
    GIB,
    RAY_IDLE,
    RAY_SYSTEM,
    JobMemoryWatch,
    PeakTracker,
    component_of,
    format_memory_table,
)


@pytest.mark.parametrize(
    ("cmdline", "is_root", "component"),
    [
        (["python", "-m", "verl_tlt.main_ppo"], True, DRIVER),
        (["ray::WorkerDict.actor_rollout_generate_sequences"], False, "WorkerDict"),
        (["ray::DrafterWorker"], False, "DrafterWorker"),
        (["ray::TorchRolloutServer.generate", "extra"], False, "TorchRolloutServer"),
        (["ray::torch_server_0_0:TorchRolloutServer"], False, "TorchRolloutServer"),
        (["ray::agent_loop_worker_0_d0b4f8d1:AgentLoopWorkerTQ.generate"], False, "AgentLoopWorkerTQ"),
        (["ray::TransferQueueStorageUnit#0:SimpleStorageUnit"], False, "SimpleStorageUnit"),
        (["ray::IDLE"], False, RAY_IDLE),
        (["/venv/lib/python3.12/site-packages/ray/core/src/ray/raylet/raylet", "--node"], False, RAY_SYSTEM),
        ([], False, RAY_SYSTEM),
    ],
)
def test_a_process_is_named_by_its_ray_title(cmdline, is_root, component):
    assert component_of(cmdline, is_root) == component


def test_peaks_are_per_sample_sums_and_the_largest_process():
    tracker = PeakTracker()
    tracker.add([("A", 3), ("A", 4), ("B", 10)], node_used_bytes=100)
    tracker.add([("A", 6), ("B", 2)], node_used_bytes=90)
    peaks = {peak.name: peak for peak in tracker.peaks()}
    assert (peaks["A"].peak_bytes, peaks["A"].largest_process_bytes, peaks["A"].processes) == (7, 6, 2)
    assert (peaks["B"].peak_bytes, peaks["B"].largest_process_bytes, peaks["B"].processes) == (10, 10, 1)
    assert [peak.name for peak in tracker.peaks()] == ["B", "A"]
    assert tracker.node_peak_used_bytes == 100 and tracker.samples == 2


def test_the_table_puts_runs_side_by_side_and_marks_a_missing_component():
    off, on = PeakTracker(), PeakTracker()
    off.add([("WorkerDict", 2 * GIB)], node_used_bytes=5 * GIB)
    on.add([("WorkerDict", 2 * GIB), ("DrafterWorker", GIB // 2)], node_used_bytes=6 * GIB)
    table = format_memory_table({"tlt_off": off.report(), "tlt_on": on.report()}, total_bytes=24 * GIB)
    lines = table.splitlines()
    assert lines[0].split() == ["component", "tlt_off", "tlt_on"]
    assert lines[1].split() == ["WorkerDict", "2.00", "GiB", "2.00", "GiB"]
    assert lines[2].split() == ["DrafterWorker", "-", "0.50", "GiB"]
    assert "5.00 GiB" in lines[3] and "6.00 GiB" in lines[3] and "24.0 GiB" in lines[4]


# A driver that starts a child holding 64 MiB of touched memory and says so through a file, then waits.
TREE = textwrap.dedent(
    """
    import pathlib, subprocess, sys, time
    ready = pathlib.Path(sys.argv[1])
    child = "import pathlib, sys, time\\nblock = b'x' * (64 << 20)\\n"
    child += "pathlib.Path(sys.argv[1]).touch()\\ntime.sleep(120)"
    subprocess.Popen([sys.executable, "-c", child, str(ready)])
    time.sleep(120)
    """
)


def test_a_real_process_tree_is_sampled_per_component(tmp_path):
    ready = tmp_path / "ready"
    driver = subprocess.Popen([sys.executable, "-c", TREE, str(ready)], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline, "the child never allocated its block"
            time.sleep(0.05)
        watch = JobMemoryWatch(driver.pid)
        watch.sample()
        peaks = {peak.name: peak for peak in watch.tracker.peaks()}
        assert set(peaks) == {DRIVER, RAY_SYSTEM}  # the child has no Ray title
        assert peaks[RAY_SYSTEM].peak_bytes >= 64 << 20
        assert watch.tracker.node_peak_used_bytes > 0
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
