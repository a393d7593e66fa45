"""Decode counters: acceptance length per strategy, over one engine and over several replicas; decode costs by
batch-size group."""

from __future__ import annotations

import pytest

from verl_tlt.metrics.decode_metrics import position_acceptance, strategy_acceptance
from verl_tlt.policy.decode_stats import DecodeCosts, DecodeStats, batch_group, position_bucket
from verl_tlt.spec.strategy import SpecStrategy


def test_acceptance_per_strategy_is_tokens_committed_per_verified_row():
    stats = DecodeStats()
    chain4, chain2 = SpecStrategy.parse("4_1_4"), SpecStrategy.parse("2_1_2")
    stats.record(chain4, batch_size=2, tokens=9, seconds=0.1)  # rows committed 5 and 4
    stats.record(chain4, batch_size=1, tokens=2, seconds=0.1)
    stats.record(chain2, batch_size=3, tokens=6, seconds=0.1)
    stats.record(None, batch_size=3, tokens=3, seconds=0.1)  # plain steps do not count
    assert stats.acceptance_by_strategy() == {"4_1_4": pytest.approx(11 / 3), "2_1_2": 2.0}
    other = DecodeStats()
    other.record(chain4, batch_size=1, tokens=5, seconds=0.1)
    merged = strategy_acceptance([stats.as_dict(), other.as_dict(), {"steps_plain": 1}])
    assert merged == {"4_1_4": pytest.approx(16 / 4), "2_1_2": 2.0}


def test_batch_groups_are_powers_of_two():
    assert [batch_group(n) for n in (1, 2, 3, 4, 7, 8, 31, 32, 33, 64, 100)] == [1, 2, 2, 4, 4, 8, 16, 32, 32, 64, 64]
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        batch_group(0)


def test_decode_costs_sum_per_group_and_arm_until_taken():
    costs = DecodeCosts()
    costs.record("plain", batch_size=5, tokens=5, seconds=0.5)
    costs.record("plain", batch_size=6, tokens=6, seconds=0.25)
    costs.record("4_1_4", batch_size=7, tokens=14, seconds=1.0)
    costs.record("plain", batch_size=40, tokens=40, seconds=0.5)
    taken = costs.take()
    assert taken == {"4": {"plain": [11, 0.75, 2], "4_1_4": [14, 1.0, 1]}, "32": {"plain": [40, 0.5, 1]}}
    assert costs.take() == {}  # taking starts afresh
    costs.record("2_1_2", batch_size=1, tokens=2, seconds=0.01)
    assert costs.take() == {"1": {"2_1_2": [2, 0.01, 1]}}


def test_decode_stats_count_until_taken_and_start_afresh():
    stats = DecodeStats()
    stats.record(SpecStrategy.parse("4_1_4"), batch_size=2, tokens=9, seconds=0.1)
    stats.record(None, batch_size=3, tokens=3, seconds=0.2)
    stats.record_sources({"eagle": 8}, {"eagle": 5})
    taken = stats.take()
    assert (taken["steps_sd"], taken["steps_plain"], taken["accepted_by_source"]) == (1, 1, {"eagle": 5})
    assert stats.take() == DecodeStats().as_dict()  # every counter back at zero, histograms and sources included
    stats.record(None, batch_size=1, tokens=1, seconds=0.1)
    assert stats.take()["strategy_histogram"] == {"all": {"plain": 1}}


def test_acceptance_per_response_position_bucket_over_replicas():
    assert [position_bucket(p) for p in (0, 255, 256, 1023, 1024, 4095, 4096, 16384, 10**6)] == [
        "0-255",
        "0-255",
        "256-1023",
        "256-1023",
        "1024-4095",
        "1024-4095",
        "4096-16383",
        "16384+",
        "16384+",
    ]
    stats, other = DecodeStats(), DecodeStats()
    stats.record_positions([10, 300, 5000], [3, 5, 2])
    other.record_positions([20, 6000], [1, 4])
    merged = position_acceptance([stats.as_dict(), other.as_dict(), {"steps_plain": 1}])
    assert merged == {"0-255": 2.0, "256-1023": 5.0, "4096-16383": 3.0}
    assert stats.take()["sd_rows_by_position"] == {"0-255": 1, "256-1023": 1, "4096-16383": 1}
    assert stats.as_dict()["sd_rows_by_position"] == {}
