"""The gate every backend asks: speculate while 1 <= running requests <= threshold, in which bucket, with which arms."""

from __future__ import annotations

import pytest

from verl_tlt.policy.gate import (
    DEFAULT_BUCKETS,
    PLAIN,
    SpeculationGate,
    bucket_problem,
    default_buckets,
)


def test_the_threshold_is_inclusive_and_an_empty_batch_never_speculates():
    gate = SpeculationGate(4)
    assert [gate.speculates(n) for n in range(0, 7)] == [False, True, True, True, True, False, False]
    assert not any(SpeculationGate(0).speculates(n) for n in range(0, 5))  # threshold 0: a plain run


def test_buckets_default_to_those_the_threshold_reaches_and_label_each_batch_size():
    gate = SpeculationGate(10)
    assert gate.buckets == (1, 2, 3, 4, 6, 8) == default_buckets(10)
    assert [gate.bucket_of(n) for n in (0, 1, 2, 5, 7, 8, 10, 11)] == [None, 1, 2, 4, 6, 8, 8, None]
    assert SpeculationGate(32).buckets == DEFAULT_BUCKETS


def test_the_ranges_of_a_schedule_split_at_the_threshold():
    assert SpeculationGate(4).speculative_ranges(16) == [(1, 4, True), (5, 16, False)]
    assert SpeculationGate(4).speculative_ranges(4) == [(1, 4, True)]
    assert SpeculationGate(32).speculative_ranges(8) == [(1, 8, True)]
    assert SpeculationGate(0).speculative_ranges(8) == [(1, 8, False)]
    gate = SpeculationGate(5)
    for first, last, speculates in gate.speculative_ranges(12):  # each range agrees with the comparison
        assert all(gate.speculates(n) == speculates for n in range(first, last + 1))


def test_plain_is_an_arm_from_plain_arm_min_batch_on():
    gate = SpeculationGate(8, (1, 4))
    assert gate.arm_names(1, ("4_1_4",), plain_arm_min_batch=4) == ["4_1_4"]
    assert gate.arm_names(4, ("4_1_4",), plain_arm_min_batch=4) == ["4_1_4", PLAIN]


@pytest.mark.parametrize(
    ("buckets", "threshold", "problem"),
    [
        ((1, 2, 4), 4, None),
        ((2, 4), 4, "ascend strictly from 1"),
        ((1, 4, 2), 4, "ascend strictly from 1"),
        ((1, 1, 2), 4, "ascend strictly from 1"),
        ((1, 8), 4, "stay <= threshold=4"),
    ],
)
def test_bucket_problems_are_named(buckets, threshold, problem):
    found = bucket_problem(buckets, threshold)
    assert (found is None) if problem is None else (problem in found)
    if problem is not None:
        with pytest.raises(ValueError, match=problem):
            SpeculationGate(threshold, buckets)


def test_no_buckets_is_a_problem_for_a_config_but_means_the_defaults_to_the_gate():
    assert "ascend strictly from 1" in bucket_problem((), 4)
    assert SpeculationGate(4, ()).buckets == (1, 2, 3, 4)


def test_a_negative_threshold_is_refused():
    with pytest.raises(ValueError, match="threshold must be >= 0"):
        SpeculationGate(-1)
