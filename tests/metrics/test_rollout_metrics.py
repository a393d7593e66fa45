"""One rollout's TLT metrics from the replicas' records and decode counters."""

from __future__ import annotations

import pytest

from tests.metrics.test_rollout_trace import RECORDS, record, sd
from verl_tlt.metrics.rollout_metrics import rollout_metrics

STATS = [
    {
        "steps_sd": 6,
        "steps_plain": 4,
        "tokens_sd": 30,
        "tokens_plain": 10,
        "drafter_failures": 1,
        "strategy_histogram": {"1": {"8_4_16": 4, "4_1_4": 1}, "2": {"4_1_4": 1}},
        "sd_rows_by_strategy": {"8_4_16": 4, "4_1_4": 3},
        "sd_tokens_by_strategy": {"8_4_16": 20, "4_1_4": 6},
    },
    {
        "steps_plain": 10,
        "tokens_plain": 20,
        "strategy_histogram": None,
        "sd_rows_by_strategy": {"4_1_4": 1},
        "sd_tokens_by_strategy": {"4_1_4": 4},
    },
]


def test_rollout_metrics_from_records_and_sd_stats():
    metrics = rollout_metrics(RECORDS, STATS)
    # Finish times since the rollout start (100.0): 1, 3, 10, 2, 4; lengths 10, 30, 200, 20, 40.
    assert metrics == pytest.approx(
        {
            "tlt/tail/time_to_50pct_s": 3.0,
            "tlt/tail/time_to_90pct_s": 10.0,
            "tlt/tail/time_to_100pct_s": 10.0,
            "tlt/tail/last_10pct_share": 0.0,
            "tlt/tail/response_len_p50": 30.0,
            "tlt/tail/response_len_p90": 200.0,
            "tlt/tail/response_len_max": 200.0,
            "tlt/rollout/time_s": 10.0,  # start to last finish
            "tlt/tail/extension_s": 1.0,  # first replica closed (111.0) minus the last finish (110.0)
            "tlt/sd/acceptance_length": 3.0,  # (20 accepted + 10 bonus) / 10 verify steps
            "tlt/sd/step_share": 0.3,  # 6 SD steps of 20
            "tlt/sd/token_share": 0.5,  # 30 SD tokens of 60
            "tlt/sd/drafter_failures": 1.0,
            "tlt/sd/strategy/8_4_16": 0.2,  # 4 of 20 steps
            "tlt/sd/strategy/4_1_4": 0.1,  # 1 + 1 over both buckets
            "tlt/sd/strategy_acceptance/8_4_16": 5.0,  # 20 tokens committed by 4 verified rows
            "tlt/sd/strategy_acceptance/4_1_4": 2.5,  # (6 + 4) / (3 + 1), over both replicas
            "tlt/sd/source/eagle/acceptance_length": 3.75,  # every strategy drafts with the drafter: 30 / 8
        },
        abs=1e-12,
    )


def test_group_draft_strategies_and_sources_get_metric_keys_without_colons():
    stats = [
        {
            "steps_sd": 2,
            "strategy_histogram": {"1": {"suffix:8_1_8": 1, "mixed:4_1_4": 1}},
            "sd_rows_by_strategy": {"suffix:8_1_8": 2, "mixed:4_1_4": 1},
            "sd_tokens_by_strategy": {"suffix:8_1_8": 14, "mixed:4_1_4": 4},
            "drafted_by_source": {"suffix": 18, "eagle": 2},
            "accepted_by_source": {"suffix": 12, "eagle": 1},
        }
    ]
    metrics = rollout_metrics([], stats)
    assert all(":" not in key for key in metrics)
    assert metrics["tlt/sd/strategy/suffix/8_1_8"] == 0.5
    assert metrics["tlt/sd/strategy_acceptance/suffix/8_1_8"] == 7.0
    assert metrics["tlt/sd/source/suffix/draft_share"] == pytest.approx(0.9)
    assert metrics["tlt/sd/source/suffix/accept_rate"] == pytest.approx(12 / 18)
    assert metrics["tlt/sd/source/eagle/tokens_saved"] == 1.0
    assert metrics["tlt/sd/source/mixed/acceptance_length"] == 4.0


def test_overrun_is_how_long_training_ran_past_the_last_response():
    assert "tlt/spot/overrun_s" not in rollout_metrics(RECORDS, STATS)  # no training this rollout
    assert rollout_metrics(RECORDS, STATS, training_stopped_at=110.25)["tlt/spot/overrun_s"] == 0.25
    assert rollout_metrics(RECORDS, STATS, training_stopped_at=105.0)["tlt/spot/overrun_s"] == 0.0  # stopped early
    assert "tlt/spot/overrun_s" not in rollout_metrics([], [], training_stopped_at=1.0)


def test_rollout_metrics_without_speculation_has_no_acceptance_length():
    records = [record(0, 0.0, 5.0, [1.0, 2.0, 4.0, 4.5], [1, 2, 3, 4], sd(output=10))]
    metrics = rollout_metrics(records, [{"steps_plain": 8, "tokens_plain": 10}])
    assert "tlt/sd/acceptance_length" not in metrics
    assert metrics["tlt/sd/step_share"] == 0.0 and metrics["tlt/sd/token_share"] == 0.0
    assert metrics["tlt/rollout/time_s"] == 4.5 and metrics["tlt/tail/extension_s"] == 0.5
    assert metrics["tlt/tail/last_10pct_share"] == pytest.approx(0.0)
    assert not any(key.startswith("tlt/sd/strategy/") for key in metrics)


def test_rollout_metrics_of_an_empty_rollout_are_zero_sd_shares_only():
    expected = {"tlt/sd/step_share": 0.0, "tlt/sd/token_share": 0.0, "tlt/sd/drafter_failures": 0.0}
    assert rollout_metrics([], []) == expected
    assert rollout_metrics([None, None], [{}, {}]) == expected


def test_self_test_counts_become_drafter_metrics():
    stats = [
        {"steps_plain": 1, "self_test": {"runs": 1, "refused": 1, "seconds": 0.4, "last_rate": 0.1}},
        {"steps_plain": 1, "self_test": {"runs": 2, "refused": 0, "seconds": 0.9, "last_rate": 0.5}},
        {"steps_plain": 1, "self_test": {"runs": 0, "refused": 0, "seconds": 0.0, "last_rate": None}},
        {"steps_plain": 1},  # a server without a self-test (vLLM today)
    ]
    metrics = rollout_metrics([], stats)
    assert metrics["tlt/drafter/self_test_runs"] == 3.0 and metrics["tlt/drafter/self_test_refused"] == 1.0
    assert metrics["tlt/drafter/self_test_s"] == 0.9
    assert metrics["tlt/drafter/self_test_accept_rate"] == pytest.approx(0.3)
    assert not any(key.startswith("tlt/drafter/self_test") for key in rollout_metrics([], [{"steps_plain": 1}]))


def test_the_policys_predictions_and_plain_steps_that_nothing_paid_for_are_reported():
    reports = [
        {
            "unpaid_plain_steps": 30,
            "cannot_pay": "alpha=0.30 ...",
            "arms": {"4_1_4": {"predicted": 9.0, "observed": 8.0}},
        },
        {"unpaid_plain_steps": 5, "cannot_pay": None, "arms": {"4_1_4": {"predicted": 11.0, "observed": 12.0}}},
    ]
    metrics = rollout_metrics([], [{"policy": report} for report in reports])
    assert metrics["tlt/sd/unpaid_plain_steps"] == 35 and metrics["tlt/sd/cannot_pay_replicas"] == 1
    assert metrics["tlt/sd/predicted_rate/4_1_4"] == 10.0 and metrics["tlt/sd/observed_rate/4_1_4"] == 10.0
    assert "tlt/sd/unpaid_plain_steps" not in rollout_metrics([], [{}])  # no policy, no keys
