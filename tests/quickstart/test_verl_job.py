"""run_verl_job with a stand-in for verl (a small module that writes verl's metrics lines): the caller is polled
while the job runs, and a job that overruns its timeout or whose caller fails is killed."""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from verl_tlt.quickstart import verl_job
from verl_tlt.quickstart.verl_job import METRICS_FILE, VerlJobError, run_verl_job

# Writes two steps to the metrics file, then waits until the caller (its poll callback) answers through a file, so
# the test needs no timing: the job can only finish after the callback saw both steps.
FAKE_VERL = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    metrics = pathlib.Path(os.environ["VERL_FILE_LOGGER_PATH"])
    with metrics.open("a") as f:
        for step in (1, 2):
            f.write(json.dumps({"step": step, "data": {"timing_s/step": 1.0}}) + "\\n")
    answer = metrics.with_name("answer")
    while not answer.exists() and "forever" not in sys.argv:
        time.sleep(0.01)
    while "forever" in sys.argv:
        time.sleep(0.01)
    """
)


@pytest.fixture
def fake_verl(tmp_path, monkeypatch):
    (tmp_path / "fake_verl.py").write_text(FAKE_VERL)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    stopped = []
    # Never `ray stop` for real here: it would stop every Ray cluster of this user on the machine.
    monkeypatch.setattr(verl_job, "_stop_ray", lambda env: stopped.append(True))
    return stopped


def test_the_caller_is_polled_with_the_metrics_file_while_the_job_runs(fake_verl, tmp_path):
    seen = []

    def on_poll(path):
        rows = verl_job.read_metrics(path)
        seen.append(len(rows))
        if len(rows) == 2:
            path.with_name("answer").touch()

    result = run_verl_job([], tmp_path / "job", entry_module="fake_verl", timeout_s=120, on_poll=on_poll, poll_s=0.05)
    assert result.returncode == 0 and [m["step"] for m in result.metrics] == [1, 2]
    assert seen[-1] == 2 and (tmp_path / "job" / METRICS_FILE).exists()


def test_a_job_past_its_timeout_is_killed_and_reported(fake_verl, tmp_path):
    with pytest.raises(VerlJobError, match="exceeded 1 s and was killed"):
        run_verl_job(["forever"], tmp_path / "job", entry_module="fake_verl", timeout_s=1, poll_s=0.05)
    assert fake_verl == [True]


def test_a_failing_caller_stops_the_job_instead_of_leaving_it_running(fake_verl, tmp_path, monkeypatch):
    started = []

    def on_poll(path):
        raise KeyboardInterrupt  # what Ctrl-C raises in the waiting caller

    popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    with pytest.raises(KeyboardInterrupt):
        run_verl_job(["forever"], tmp_path / "job", entry_module="fake_verl", timeout_s=120, on_poll=on_poll)
    (process,) = started
    assert process.returncode is not None and fake_verl == [True]


def test_a_watched_job_reports_its_memory_peaks(fake_verl, tmp_path):
    def on_poll(path):
        if len(verl_job.read_metrics(path)) == 2:
            path.with_name("answer").touch()

    result = run_verl_job(
        [], tmp_path / "job", entry_module="fake_verl", timeout_s=120, on_poll=on_poll, poll_s=0.05, watch_memory=True
    )
    assert result.memory["samples"] >= 1
    # The job's driver, and the caller (this test's process) beside it: what shares the machine with the job.
    assert sorted(row["component"] for row in result.memory["components"]) == ["caller", "driver"]
    assert all(row["peak_gib"] > 0 for row in result.memory["components"])


def test_a_failed_job_hands_over_what_it_left(fake_verl, tmp_path):
    with pytest.raises(VerlJobError) as failed:
        run_verl_job(
            ["forever"], tmp_path / "job", entry_module="fake_verl", timeout_s=1, poll_s=0.05, watch_memory=True
        )
    assert failed.value.result.returncode == -9 and failed.value.result.log_path.exists()
    assert failed.value.result.memory["samples"] >= 1
