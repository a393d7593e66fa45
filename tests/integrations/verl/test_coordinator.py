"""The spot coordinator: start on the first drained replica, stop when all drain, retry a start only while the
worker was busy with queued calls."""

from __future__ import annotations

import threading
import time

import pytest

from verl_tlt.drafter.spot_schedule import SpotSchedule
from verl_tlt.integrations.verl.coordinator import SpotCoordinator


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakePool:
    """DrafterPool's surface: start(idle) -> rank | None, stop() -> status | None, available, waiting_on_calls(idle)."""

    def __init__(self, clock: FakeClock | None = None, start_result: int | None = 0, stop_seconds: float = 0.0):
        self.clock, self.start_result, self.stop_seconds = clock, start_result, stop_seconds
        self.available = True
        self.starts: list[list[int]] = []
        self.stops = 0
        self.stop_status: dict | None = {"burst_steps": 7, "burst_seconds": 3.5}
        self.waiting = False  # a failed start was for queued calls still running on the worker
        self._lock = threading.Lock()

    def start(self, idle: list[int], prepare=None) -> int | None:
        with self._lock:
            self.starts.append(list(idle))
        if prepare is not None and self.start_result is not None:
            prepare(self.start_result)  # as DrafterPool: for the chosen worker, before it starts
        return self.start_result

    def waiting_on_calls(self, idle: list[int]) -> bool:
        return self.waiting

    def stop(self) -> dict | None:
        with self._lock:
            self.stops += 1
        if self.clock is not None:
            self.clock.now += self.stop_seconds  # the stop call takes this long
        return self.stop_status


class Script:
    """The replicas' in-flight counts, set by the test."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts
        self.calls = 0

    def __call__(self) -> list[int]:
        self.calls += 1
        return list(self.counts)


def run(coordinator: SpotCoordinator, clock: FakeClock, script: Script, timeline) -> None:
    for now, counts in timeline:
        clock.now, script.counts = float(now), counts
        coordinator.tick()


def make(num_replicas: int, counts: list[int], **pool_kwargs):
    clock = FakeClock()
    pool = FakePool(clock, **pool_kwargs)
    script = Script(counts)
    coordinator = SpotCoordinator(script, pool, SpotSchedule(num_replicas), poll_interval_s=0.001, clock=clock)
    return coordinator, pool, script, clock


def test_starts_on_the_first_drained_replica_and_stops_exactly_when_all_drain():
    coordinator, pool, script, clock = make(3, [0, 0, 0], stop_seconds=0.25)
    run(coordinator, clock, script, [(0, [2, 3, 1]), (1, [2, 3, 0])])
    assert pool.starts == [[2]] and pool.stops == 0  # replica 2 drained while 0 and 1 still generate
    run(coordinator, clock, script, [(2, [0, 3, 0]), (3, [0, 1, 0])])
    assert pool.starts == [[2]] and pool.stops == 0  # already training: no second start
    run(coordinator, clock, script, [(4, [0, 0, 0])])
    assert pool.stops == 1
    run(coordinator, clock, script, [(5, [0, 0, 0]), (6, [0, 0, 0])])
    assert pool.starts == [[2]] and pool.stops == 1

    metrics = coordinator.finish()
    assert pool.stops == 1  # nothing left to preempt
    # Idle replica-seconds: t1->2: 1, t2->3: 2, t3->4: 2 = 5, all while training (t1..t4).
    assert metrics == {
        "tlt/spot/idle_replica_s": 5.0,
        "tlt/spot/trained_replica_s": 5.0,
        "tlt/spot/idle_share_used": 1.0,
        "tlt/spot/training_s": 3.0,
        "tlt/spot/starts": 1.0,
        "tlt/spot/stop_latency_s": 0.25,
        "tlt/spot/poll_errors": 0.0,
        "tlt/spot/stops_in_background": 0.0,
        "tlt/drafter/burst_steps": 7.0,
        "tlt/drafter/step_s": 0.5,
    }


def test_the_idle_list_holds_every_drained_replica_that_served_this_rollout():
    coordinator, pool, script, clock = make(4, [0, 0, 0, 0])
    # Replica 0 never had a request: it is not "drained", and is not offered for training.
    run(coordinator, clock, script, [(0, [0, 2, 2, 2]), (1, [0, 2, 2, 2]), (2, [0, 0, 2, 0])])
    assert pool.starts == [[1, 3]]


def test_min_idle_replicas_is_respected():
    clock, pool, script = FakeClock(), FakePool(), Script([1, 1, 1])
    coordinator = SpotCoordinator(script, pool, SpotSchedule(3, min_idle_replicas=2), clock=clock)
    run(coordinator, clock, script, [(0, [1, 1, 1]), (1, [0, 1, 1])])
    assert pool.starts == []
    run(coordinator, clock, script, [(2, [0, 0, 1])])
    assert pool.starts == [[0, 1]]


def test_a_failed_start_is_not_retried_in_the_same_rollout_and_not_counted():
    coordinator, pool, script, clock = make(3, [0, 0, 0], start_result=None)
    run(coordinator, clock, script, [(0, [1, 1, 1]), (1, [0, 1, 1]), (2, [0, 0, 1]), (3, [0, 0, 1])])
    assert pool.starts == [[0]]  # asked once; the schedule's later "start"s are swallowed
    assert not coordinator.schedule.training
    run(coordinator, clock, script, [(4, [0, 0, 0])])
    assert pool.stops == 0  # no training, so nothing to stop
    metrics = coordinator.finish()
    assert pool.stops == 0
    assert metrics["tlt/spot/starts"] == 0.0 and metrics["tlt/spot/training_s"] == 0.0
    assert metrics["tlt/spot/trained_replica_s"] == 0.0 and metrics["tlt/spot/idle_share_used"] == 0.0
    assert metrics["tlt/spot/idle_replica_s"] == 5.0  # t1->2: 1, t2->3: 2, t3->4: 2, none of it used
    assert metrics["tlt/drafter/burst_steps"] == 0.0 and metrics["tlt/spot/stop_latency_s"] == 0.0


def test_a_start_refused_while_the_worker_runs_queued_calls_is_asked_again_until_it_succeeds():
    """The worker still stores the last step's captures when its replica drains: the coordinator asks again at the
    next polls, and the burst starts once the calls are done."""
    coordinator, pool, script, clock = make(2, [0, 0], start_result=None)
    pool.waiting = True
    run(coordinator, clock, script, [(0, [1, 1]), (1, [0, 1]), (2, [0, 1])])
    assert pool.starts == [[0], [0]] and not coordinator.schedule.training
    pool.waiting, pool.start_result = False, 0
    run(coordinator, clock, script, [(3, [0, 1])])
    assert pool.starts == [[0], [0], [0]] and coordinator.schedule.training
    run(coordinator, clock, script, [(4, [0, 0])])
    metrics = coordinator.finish()
    assert pool.stops == 1 and metrics["tlt/spot/starts"] == 1.0 and metrics["tlt/spot/training_s"] == 1.0


def test_an_unavailable_pool_is_never_asked_to_start():
    coordinator, pool, script, clock = make(2, [0, 0])
    pool.available = False
    run(coordinator, clock, script, [(0, [1, 1]), (1, [0, 1]), (2, [0, 1]), (3, [0, 0])])
    assert pool.starts == [] and pool.stops == 0
    assert coordinator.finish()["tlt/spot/starts"] == 0.0


def test_finish_preempts_a_burst_that_still_runs():
    coordinator, pool, script, clock = make(2, [0, 0], stop_seconds=0.5)
    run(coordinator, clock, script, [(0, [1, 1]), (1, [0, 1]), (3, [0, 1])])
    assert pool.starts == [[0]] and pool.stops == 0
    clock.now = 4.0
    metrics = coordinator.finish()
    assert pool.stops == 1 and not coordinator.schedule.training
    assert metrics["tlt/spot/starts"] == 1.0 and metrics["tlt/spot/stop_latency_s"] == 0.5
    assert metrics["tlt/drafter/burst_steps"] == 7.0
    assert metrics["tlt/spot/training_s"] == 2.0  # accounted up to the last poll (t=3)
    assert coordinator.finish()["tlt/spot/starts"] == 1.0 and pool.stops == 1  # a second finish stops nothing
    assert metrics["tlt/spot/stops_in_background"] == 0.0


def test_a_stop_that_left_its_step_to_finish_in_the_background_is_counted():
    coordinator, pool, script, clock = make(2, [0, 0])
    pool.stop_status = {"burst_steps": 2, "burst_seconds": 1.0, "finishing": True}
    run(coordinator, clock, script, [(0, [1, 1]), (1, [0, 1]), (2, [0, 0])])
    metrics = coordinator.finish()
    assert metrics["tlt/spot/stops_in_background"] == 1.0 and metrics["tlt/drafter/burst_steps"] == 2.0


def test_a_lost_worker_on_stop_records_latency_but_no_burst():
    coordinator, pool, script, clock = make(2, [0, 0], stop_seconds=0.125)
    pool.stop_status = None
    run(coordinator, clock, script, [(0, [1, 1]), (1, [0, 1]), (2, [0, 0])])
    metrics = coordinator.finish()
    assert pool.stops == 1
    assert metrics["tlt/spot/stop_latency_s"] == 0.125 and metrics["tlt/drafter/burst_steps"] == 0.0


def test_tick_raises_a_poll_error_that_the_thread_would_count():
    def broken() -> list[int]:
        raise ConnectionError("replica gone")

    coordinator = SpotCoordinator(broken, FakePool(), SpotSchedule(2))
    with pytest.raises(ConnectionError):
        coordinator.tick()
    assert coordinator.poll_errors == 0  # counting is the watch loop's job


# ----- the real thread -------------------------------------------------------------------------------------------


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"hang guard: condition not reached within {timeout} s"
        time.sleep(0.001)


def test_the_watch_thread_starts_and_stops_training_during_a_rollout():
    pool, script = FakePool(), Script([2, 2])
    coordinator = SpotCoordinator(script, pool, SpotSchedule(2), poll_interval_s=0.001)
    coordinator.begin()
    with pytest.raises(RuntimeError, match="twice"):
        coordinator.begin()
    wait_for(lambda: script.calls >= 3)
    script.counts = [2, 0]
    wait_for(lambda: pool.starts)
    script.counts = [0, 0]
    wait_for(lambda: pool.stops)
    metrics = coordinator.finish()
    assert coordinator._thread is None
    assert pool.starts == [[1]] and pool.stops == 1
    assert metrics["tlt/spot/starts"] == 1.0 and metrics["tlt/drafter/burst_steps"] == 7.0
    assert metrics["tlt/spot/training_s"] > 0.0 and metrics["tlt/spot/poll_errors"] == 0.0
    calls = script.calls
    time.sleep(0.02)
    assert script.calls == calls  # the thread is gone


def test_begin_resets_the_rollout_so_a_failed_start_is_retried_next_time_and_finish_preempts():
    pool, script = FakePool(start_result=None), Script([1, 1])
    coordinator = SpotCoordinator(script, pool, SpotSchedule(2), poll_interval_s=0.001)
    coordinator.begin()
    wait_for(lambda: script.calls >= 2)
    script.counts = [0, 1]
    wait_for(lambda: script.calls >= 12)
    assert coordinator.finish()["tlt/spot/starts"] == 0.0
    assert pool.starts == [[0]]

    pool.start_result, script.counts = 1, [1, 1]
    polled = script.calls
    coordinator.begin()  # next rollout: asks again
    wait_for(lambda: script.calls >= polled + 2)
    script.counts = [1, 0]
    wait_for(lambda: len(pool.starts) == 2)
    metrics = coordinator.finish()  # replica 0 still generates: the burst is preempted
    assert pool.starts == [[0], [1]] and pool.stops == 1
    assert metrics["tlt/spot/starts"] == 1.0 and not coordinator.schedule.training


def test_poll_errors_are_counted_not_raised():
    pool, failures = FakePool(), []

    def flaky() -> list[int]:
        if len(failures) < 3:
            failures.append(1)
            raise TimeoutError("drain check timed out")
        failures.append(0)
        return [1, 1]

    coordinator = SpotCoordinator(flaky, pool, SpotSchedule(2), poll_interval_s=0.001)
    coordinator.begin()
    wait_for(lambda: len(failures) >= 6)
    metrics = coordinator.finish()
    assert coordinator.poll_errors == 3 and metrics["tlt/spot/poll_errors"] == 3.0
    assert pool.starts == [] and pool.stops == 0


def test_the_drained_replica_is_prepared_before_its_burst_and_device_moves_are_reported():
    clock, prepared = FakeClock(), []
    pool = FakePool(clock, start_result=2)
    pool.stop_status = {"burst_steps": 4, "burst_seconds": 2.0, "onload_s": 0.3, "offload_s": 0.4}
    script = Script([0, 0, 0])
    coordinator = SpotCoordinator(script, pool, SpotSchedule(3), clock=clock, prepare=prepared.append)
    run(coordinator, clock, script, [(0, [2, 3, 1]), (1, [2, 3, 0])])
    assert prepared == [2] and pool.starts == [[2]]  # replica 2 frees its engine's memory for the burst
    run(coordinator, clock, script, [(2, [0, 0, 0])])
    metrics = coordinator.finish()
    assert metrics["tlt/spot/onload_s"] == 0.3 and metrics["tlt/spot/offload_s"] == 0.4
