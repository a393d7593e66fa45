import pytest

from verl_tlt.tasks.evaluate import evaluate_tasks, format_report, length_quantiles


def test_length_quantiles_are_nearest_rank():
    assert length_quantiles([5, 1, 9, 3, 7, 2, 8, 4, 6, 10]) == {"tokens_p50": 5, "tokens_p90": 9, "tokens_max": 10}
    assert length_quantiles([4]) == {"tokens_p50": 4, "tokens_p90": 4, "tokens_max": 4}
    with pytest.raises(ValueError, match="no responses"):
        length_quantiles([])


@pytest.mark.slow
def test_the_evaluation_of_smollm2_reports_every_task_with_consistent_rates():
    from verl_tlt.models.prepare import ensure_model

    report = evaluate_tasks(
        ensure_model("smollm2-135m"), ["chain_sum", "gsm_symbolic"], num_problems=2, group_size=2, max_new_tokens=24
    )
    assert [row["task"] for row in report["tasks"]] == ["chain_sum", "gsm_symbolic"]
    for row in report["tasks"]:
        assert row["problems"] == 2
        for key in ("greedy_pass", "sampled_pass", "varied_groups", "truncated"):
            assert 0.0 <= row[key] <= 1.0
        assert 1 <= row["tokens_p50"] <= row["tokens_p90"] <= row["tokens_max"] <= 24
        assert (row["tokens_max"] == 24) or row["truncated"] == 0.0  # a cut response is one at the limit
    assert "chain_sum" in format_report(report)
