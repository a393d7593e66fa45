"""Decode counters: acceptance length per strategy, over one engine and over several replicas; decode costs by
batch-size group."""

from __future__ import annotations

import pytest

from verl_tlt.policy.decode_stats import (
    DecodeCosts,
    DecodeStats,
    batch_group,
    ms_per_token_by_batch,
    source_metrics,
    strategy_acceptance,
)
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


def test_ms_per_token_pools_strategies_and_sums_records():
    first = {
        "4": {"plain": [10, 0.02, 2], "4_1_4": [30, 0.03, 2], "2_1_2": [10, 0.02, 2]},
        "32": {"plain": [64, 0.032, 2]},
    }
    second = {"4": {"plain": [10, 0.04, 2]}, "1": {"6_1_6": [0, 0.1, 1]}}  # a group without tokens is left out
    assert ms_per_token_by_batch([first, second]) == {
        "1": {},
        "4": {"plain": pytest.approx(3.0), "sd": pytest.approx(1.25)},  # 60 ms / 20 plain tokens, 50 ms / 40 SD ones
        "32": {"plain": pytest.approx(0.5)},
    }
    assert ms_per_token_by_batch([]) == {}


def test_source_metrics_split_drafts_by_the_source_that_drafted_them():
    stats = DecodeStats()
    stats.record(SpecStrategy.parse("4_1_4"), batch_size=1, tokens=3, seconds=0.1)
    stats.record(SpecStrategy.parse("suffix:8_1_8"), batch_size=2, tokens=12, seconds=0.1)
    stats.record(SpecStrategy.parse("mixed:4_1_4"), batch_size=1, tokens=5, seconds=0.1)
    stats.record_sources({"eagle": 4}, {"eagle": 2})
    stats.record_sources({"suffix": 12}, {"suffix": 10})
    stats.record_sources({"suffix": 3, "eagle": 1}, {"suffix": 3, "eagle": 1})  # mixed: 3 suffix levels, 1 eagle
    metrics = source_metrics([stats.as_dict(), {"steps_plain": 4}])
    assert metrics["suffix/draft_share"] == pytest.approx(15 / 20)
    assert metrics["eagle/draft_share"] == pytest.approx(5 / 20)
    assert metrics["suffix/accept_rate"] == pytest.approx(13 / 15)
    assert metrics["eagle/accept_rate"] == pytest.approx(3 / 5)
    assert metrics["suffix/tokens_saved"] == 13
    # acceptance length per arm source: committed tokens per verified row
    assert metrics["eagle/acceptance_length"] == 3.0
    assert metrics["suffix/acceptance_length"] == 6.0
    assert metrics["mixed/acceptance_length"] == 5.0
