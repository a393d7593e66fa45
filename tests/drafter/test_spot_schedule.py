"""The spot-training schedule: start when a replica drains while others generate, stop when all have drained."""

from __future__ import annotations

import pytest

from verl_tlt.drafter.spot_schedule import SpotSchedule


def test_training_starts_on_the_first_drained_replica_and_stops_when_all_are_done():
    schedule = SpotSchedule(num_replicas=3)
    timeline = [
        ([0, 0, 0], None),  # nothing submitted yet: no replica has "drained"
        ([5, 4, 6], None),
        ([2, 1, 3], None),
        ([0, 1, 2], "start"),  # replica 0 drained while the others still generate
        ([0, 0, 1], None),
        ([0, 0, 1], None),
        ([0, 0, 0], "stop"),
        ([0, 0, 0], None),
    ]
    for now, (in_flight, expected) in enumerate(timeline):
        assert schedule.observe(in_flight, float(now)) == expected, (now, in_flight)
    stats = schedule.stats
    # Idle replica-seconds: t3->4: 1, t4->5: 2, t5->6: 2 = 5; training covered all of them.
    assert stats.idle_replica_seconds == pytest.approx(5.0)
    assert stats.idle_share_used == pytest.approx(1.0) and stats.num_starts == 1 and stats.training_seconds == 3.0


def test_min_idle_replicas_delays_the_start():
    schedule = SpotSchedule(num_replicas=4, min_idle_replicas=2)
    assert schedule.observe([1, 1, 1, 1], 0.0) is None
    assert schedule.observe([0, 1, 1, 1], 1.0) is None
    assert schedule.observe([0, 0, 1, 1], 2.0) == "start"
    assert schedule.stats.idle_replica_seconds == pytest.approx(1.0)  # one idle replica for 1 s before the start
    assert schedule.stats.idle_share_used == 0.0


def test_a_single_replica_never_has_idle_peers():
    schedule = SpotSchedule(num_replicas=1)
    assert [schedule.observe([n], float(t)) for t, n in enumerate([3, 2, 1, 0])] == [None] * 4


def test_reset_begins_a_new_rollout_and_bad_input_is_refused():
    schedule = SpotSchedule(num_replicas=2)
    schedule.observe([1, 1], 0.0)
    assert schedule.observe([0, 1], 1.0) == "start"
    schedule.reset()
    assert not schedule.training and schedule.stats.num_starts == 0
    with pytest.raises(ValueError, match="in-flight counts"):
        schedule.observe([1], 0.0)
    with pytest.raises(ValueError, match="min_idle_replicas"):
        SpotSchedule(num_replicas=2, min_idle_replicas=3)
