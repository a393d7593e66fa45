"""Metrics over several engines' decode counters: decode costs per token by batch group, drafts per source."""

from __future__ import annotations

import pytest

from verl_tlt.metrics.decode_metrics import ms_per_token_by_batch, source_metrics
from verl_tlt.policy.decode_stats import DecodeStats
from verl_tlt.spec.strategy import SpecStrategy


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
