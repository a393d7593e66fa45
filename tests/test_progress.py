"""The progress reporter: a line only when one is due, always the last one, and an estimate from the average."""

from __future__ import annotations

import pytest

from verl_tlt.progress import Progress, format_duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(total=10, every_s=10.0):
    clock, lines = FakeClock(), []
    return Progress("toy SFT", total, every_s=every_s, emit=lines.append, clock=clock), clock, lines


def test_a_line_is_emitted_only_when_due_and_for_the_last_unit():
    progress, clock, lines = make()
    clock.now += 3
    assert not progress.update(1) and lines == []
    clock.now += 8  # 11 s since the start
    assert progress.update(2) and len(lines) == 1
    clock.now += 1
    assert progress.update(10) and len(lines) == 2  # complete: reported even though only 1 s passed


def test_the_estimate_is_the_average_cost_of_the_units_left():
    progress, clock, lines = make()
    clock.now += 20
    progress.update(4)
    assert progress.eta_s() == pytest.approx(30.0)  # 5 s per unit, 6 left
    assert lines == ["toy SFT: 4/10 steps, 20 s elapsed, about 30 s left"]


def test_without_a_total_there_is_no_estimate():
    progress, clock, lines = make(total=None)
    clock.now += 12
    progress.update(7, "loss 0.5")
    assert progress.eta_s() is None and lines == ["toy SFT: 7 steps, 12 s elapsed, loss 0.5"]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="total"):
        Progress("x", -1)
    with pytest.raises(ValueError, match="every_s"):
        Progress("x", 1, every_s=0)


@pytest.mark.parametrize(
    "seconds, text", [(4.25, "4.2 s"), (42, "42 s"), (185, "3 min 05 s"), (3725, "1 h 02 min"), (-1, "0.0 s")]
)
def test_durations_read_at_every_scale(seconds, text):
    assert format_duration(seconds) == text


def test_the_last_unit_is_reported_once_and_later_heartbeats_wait_their_turn():
    progress, clock, lines = make(total=2)
    progress.update(2)
    clock.now += 1
    assert not progress.heartbeat() and not progress.update(2) and len(lines) == 1
    clock.now += 10
    assert progress.heartbeat() and len(lines) == 2


def test_advance_counts_on_from_the_units_done():
    progress, clock, lines = make(total=4)
    progress.advance()
    clock.now += 10
    assert progress.advance(2) and progress.done == 3
    assert lines == ["toy SFT: 3/4 steps, 10 s elapsed, about 3.3 s left"]


def test_an_extra_function_is_called_only_for_a_line():
    progress, clock, lines = make()
    calls = []

    def extra():
        calls.append(progress.done)
        return "loss 0.25"

    progress.update(1, extra)
    clock.now += 10
    progress.update(2, extra)
    assert calls == [2] and lines[-1].endswith("loss 0.25")
