"""The drafter-quality model between RL steps."""

from __future__ import annotations

import math

import pytest

from verl_tlt.sim.drafter_drift import DrafterDrift

DRIFT = DrafterDrift(start=0.9, ceiling=0.9, floor=0.5, drift_per_step=0.25, recover_gpu_s=100.0)


def test_an_untrained_drafter_loses_a_share_of_its_distance_to_the_floor_each_step():
    assert DRIFT.next_quality(0.9, 0.0) == pytest.approx(0.9 - 0.25 * 0.4)
    quality = 0.9
    for _ in range(50):
        quality = DRIFT.next_quality(quality, 0.0)
    assert quality == pytest.approx(0.5, abs=1e-5)


def test_training_closes_the_gap_to_the_ceiling_exponentially_in_gpu_seconds():
    trained = 0.7 + 0.2 * (1 - math.exp(-1.0))
    assert DRIFT.next_quality(0.7, 100.0) == pytest.approx(trained - 0.25 * (trained - 0.5))
    assert DRIFT.next_quality(0.7, 1e9) == pytest.approx(0.9 - 0.25 * 0.4)


def test_more_training_never_hurts():
    assert DRIFT.next_quality(0.6, 10.0) < DRIFT.next_quality(0.6, 50.0) < DRIFT.next_quality(0.6, 500.0)


def test_inconsistent_bounds_are_refused():
    with pytest.raises(ValueError, match="floor"):
        DrafterDrift(start=0.4, ceiling=0.9, floor=0.5, drift_per_step=0.1, recover_gpu_s=1.0)
