"""Long-tail shape metrics."""

from __future__ import annotations

import pytest

from verl_tlt.metrics.long_tail import long_tail_metrics


def test_long_tail_metrics_describe_when_responses_finish():
    finish = [1.0] * 8 + [2.0, 10.0]  # 8 quick, one medium, one straggler
    lengths = [30] * 8 + [100, 900]
    metrics = long_tail_metrics(finish, lengths)
    assert metrics["tlt/tail/time_to_50pct_s"] == 1.0
    assert metrics["tlt/tail/time_to_90pct_s"] == 2.0
    assert metrics["tlt/tail/time_to_100pct_s"] == 10.0
    assert metrics["tlt/tail/last_10pct_share"] == pytest.approx(0.8)  # 80% of the rollout waits for one response
    assert (metrics["tlt/tail/response_len_p50"], metrics["tlt/tail/response_len_max"]) == (30.0, 900.0)
    assert metrics["tlt/tail/response_len_p90"] == 100.0


def test_long_tail_metrics_edge_cases():
    assert long_tail_metrics([], []) == {}
    assert long_tail_metrics([0.0], [5])["tlt/tail/last_10pct_share"] == 0.0
    with pytest.raises(ValueError, match="finish times"):
        long_tail_metrics([1.0], [])
