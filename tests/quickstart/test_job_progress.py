"""Progress lines of a running verl job, from the metrics file verl appends to, with a fake clock."""

from __future__ import annotations

import json

import pytest

from verl_tlt.quickstart.job_progress import JobProgress, MetricsTail


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _line(step: int, **data) -> str:
    return json.dumps({"step": step, "data": data}) + "\n"


def test_the_tail_returns_complete_lines_once_and_waits_for_a_line_being_written(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read_new() == []  # verl has not created it yet
    first, second = _line(1, **{"timing_s/step": 5.0}), _line(2, **{"timing_s/step": 6.0})
    path.write_text(first + second[:10])
    assert tail.read_new() == [{"step": 1, "timing_s/step": 5.0}]
    assert tail.read_new() == []
    path.write_text(first + second)
    assert tail.read_new() == [{"step": 2, "timing_s/step": 6.0}]
    path.write_text(_line(1))  # a new, shorter file in its place is read from its start
    assert tail.read_new() == [{"step": 1}]


def test_before_the_first_step_a_heartbeat_says_verl_is_starting_every_interval(tmp_path):
    clock, lines = FakeClock(), []
    progress = JobProgress("tlt", 15, expected_s=100.0, every_s=10.0, emit=lines.append, clock=clock)
    path = tmp_path / "metrics.jsonl"
    for now in (2.0, 4.0, 9.0):
        clock.now = now
        progress(path)
    assert lines == []  # not yet due
    clock.now = 10.0
    progress(path)
    assert lines == [
        "tlt: verl starting (Ray, workers) and running step 1/15, 10 s elapsed, about 1 min 30 s left "
        "(as long as the previous run)"
    ]
    clock.now = 15.0
    progress(path)
    clock.now = 20.0
    progress(path)
    assert len(lines) == 2 and "20 s elapsed" in lines[1]


def test_each_finished_step_is_reported_at_once_with_its_rollout_time_acceptance_and_an_estimate(tmp_path):
    clock, lines = FakeClock(), []
    progress = JobProgress("tlt", 4, every_s=10.0, emit=lines.append, clock=clock)
    path = tmp_path / "metrics.jsonl"
    step = {"timing_s/step": 20.0, "timing_s/gen": 9.0, "tlt/rollout/time_s": 7.5, "tlt/sd/acceptance_length": 2.345}
    path.write_text(_line(1, **step))
    clock.now = 3.0  # sooner than every_s after the start: a new step is reported anyway
    progress(path)
    assert lines == [
        "tlt: step 1/4, 3.0 s elapsed, about 1 min 00 s left; step 20.0 s, rollout 7.5 s (server-measured), "
        "acceptance length 2.35"
    ]
    with path.open("a") as f:  # TLT off: verl's own rollout timing, no acceptance length
        f.write(_line(2, **{"timing_s/step": 40.0, "timing_s/gen": 9.0}))
    clock.now = 5.0
    progress(path)
    assert lines[-1] == "tlt: step 2/4, 5.0 s elapsed, about 1 min 00 s left; step 40.0 s, rollout 9.0 s (timing_s/gen)"
    clock.now = 25.0  # 20 s into step 3 of mean 30 s: 10 s of it and all of step 4 left
    progress(path)
    assert lines[-1].startswith("tlt: step 2/4, 25 s elapsed, about 40 s left;")
    clock.now = 65.0  # step 3 overran the mean: at least step 4 is left
    progress(path)
    assert lines[-1].startswith("tlt: step 2/4, 1 min 05 s elapsed, about 30 s left;")
    with path.open("a") as f:
        f.write(_line(3) + _line(4))
    clock.now = 66.0
    progress(path)
    assert lines[-1] == "tlt: step 4/4, 1 min 06 s elapsed, verl finishing; no timings logged"
    assert [r["step"] for r in progress.rows] == [1, 2, 3, 4]


def test_a_job_of_no_steps_is_refused():
    with pytest.raises(ValueError, match="total_steps must be >= 1, got 0"):
        JobProgress("x", 0)
