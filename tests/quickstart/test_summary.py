"""The quickstart's comparison rows and headline numbers, from synthetic verl metrics, traces and dumps."""

from __future__ import annotations

import json

import pytest

from verl_tlt.quickstart.summary import (
    format_decode_costs,
    format_table,
    group_drafts_headline,
    headline,
    read_trace,
    step_rows,
)
from verl_tlt.toy.task import COMPACT, Problem, solution_text

PROBLEM = Problem.from_nd(11, 4)


def _trace_record(index: int, replica: int, start: float, finishes: list[float], closed: float) -> dict:
    sd = {"num_verify_steps": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_output_tokens": 0}
    return {
        "replica": replica,
        "rollout_index": index,
        "start": start,
        "finish_times": finishes,
        "closed": closed,
        "sd": sd,
    }


def _metrics(step: int, acceptance: float | None, step_s: float = 10.0) -> dict:
    m = {
        "step": step,
        "timing_s/step": step_s,
        "timing_s/gen": 4.0,
        "timing_s/old_log_prob": 1.0,
        "timing_s/update_actor": 2.0,
        "critic/score/mean": 0.5,
    }
    if acceptance is not None:
        m["tlt/sd/acceptance_length"] = acceptance
        m["tlt/spot/idle_replica_s"] = 2.0
        m["tlt/spot/trained_replica_s"] = 1.5
        m["tlt/spot/overrun_s"] = 0.1
        m["tlt/drafter/step_s"] = 0.2
    return m


def test_rows_take_rollout_time_and_tail_extension_from_the_servers_traces(tmp_path):
    path = tmp_path / "trace.jsonl"
    records = [
        _trace_record(0, 0, 100.0, [101.0, 102.0], 104.0),
        _trace_record(0, 1, 100.5, [103.0], 104.5),
        _trace_record(1, 0, 200.0, [201.0], 203.0),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    trace = read_trace(path)
    assert sorted(trace) == [0, 1] and len(trace[0]) == 2

    outputs = {1: [{"output": solution_text(PROBLEM, COMPACT)}, {"output": solution_text(PROBLEM)}], 2: []}
    rows = step_rows([_metrics(1, 3.0), _metrics(2, None)], trace, outputs)
    first, second = rows
    assert first["rollout_s"] == pytest.approx(3.0)  # first submit 100.0 -> last finish 103.0
    assert first["tail_extension_s"] == pytest.approx(1.0)  # first replica asleep at 104.0
    assert first["compact_share"] == 0.5 and second["compact_share"] is None
    assert first["other_s"] == pytest.approx(10.0 - 4.0 - 1.0 - 2.0)
    assert first["sd_acceptance_length"] == 3.0 and "sd_acceptance_length" not in second
    assert second["rollout_s"] == pytest.approx(1.0)
    assert "engine_busy_s" not in first  # these records predate the engine's busy time
    assert read_trace(tmp_path / "missing.jsonl") == {}


def test_rows_carry_engine_busy_time_and_the_last_arrival_when_the_records_have_them():
    records = [
        {**_trace_record(0, 0, 100.0, [103.0], 104.0), "submit_times": [100.0, 101.5], "engine_busy_s": 2.5},
        {**_trace_record(0, 1, 100.5, [102.0], 104.0), "submit_times": [100.5, 102.0], "engine_busy_s": 1.0},
    ]
    (row,) = step_rows([_metrics(1, None)], {0: records}, {})
    assert row["engine_busy_s"] == pytest.approx(3.5) and row["last_submit_s"] == pytest.approx(2.0)


def test_rows_carry_the_replicas_common_weights_checksum_and_flag_replicas_that_disagree():
    same = [{**_trace_record(0, r, 100.0, [101.0], 102.0), "weights_sha256": "ab"} for r in (0, 1)]
    split = [same[0], {**same[1], "weights_sha256": "cd"}]
    old = [_trace_record(0, 0, 100.0, [101.0], 102.0)]  # a trace written without checksums
    rows = [step_rows([_metrics(1, None)], {0: records}, {})[0] for records in (same, split, old)]
    assert [row["weights_sha256"] for row in rows] == ["ab", None, None]
    assert [row.get("weights_replicas_differ", False) for row in rows] == [False, True, False]


def test_decode_costs_table_has_a_column_per_run_and_kind_present():
    decode = {
        "baseline": {"1": {"plain": 8.0}, "16": {"plain": 1.25}},
        "tlt": {"1": {"plain": 9.0, "sd": 4.0}, "16": {"sd": 1.5}},
    }
    header, one, sixteen = format_decode_costs(decode).splitlines()
    assert header.split("|")[1:] == [f" {'baseline plain':>14} ", f" {'tlt plain':>14} ", f" {'tlt sd':>14}"]
    assert one.split() == ["1", "|", "8.00", "|", "9.00", "|", "4.00"]
    assert sixteen.split() == ["16", "|", "1.25", "|", "-", "|", "1.50"]


def _rows(rollout_s: list[float], acceptance: list[float] | None) -> list[dict]:
    rows = []
    for i, r in enumerate(rollout_s):
        row = {"step": i + 1, "step_s": 10.0, "rollout_s": r, "tail_extension_s": 1.0}
        if acceptance is not None:
            row.update(
                sd_acceptance_length=acceptance[i],
                spot_idle_replica_s=2.0,
                spot_trained_replica_s=1.0,
                spot_overrun_s=0.05 * (i + 1),
                spot_stops_in_background=float(i % 2),
                drafter_step_s=0.3,
                drafter_eval_online_est_acceptance_length=acceptance[i] + 1.0,
                drafter_eval_frozen_est_acceptance_length=2.0,
                drafter_eval_online_est_coupled_acceptance_length=acceptance[i] + 2.0,
                drafter_eval_frozen_est_coupled_acceptance_length=3.0,
                drafter_eval_online_chain_acceptance_length=acceptance[i] - 1.0,
                drafter_eval_frozen_chain_acceptance_length=2.5,
            )
        rows.append(row)
    return rows


def test_headline_ratios_use_the_last_three_steps_and_total_rollout_time():
    runs = {
        "baseline": _rows([4.0, 4.0, 4.0, 4.0], None),
        "tlt": _rows([3.0, 3.0, 2.0, 2.0], [4.0, 5.0, 5.0, 6.0]),
        "frozen": _rows([3.5, 3.5, 3.5, 3.5], [4.0, 4.0, 3.0, 2.0]),
    }
    h = headline(runs)
    assert h["acceptance_online_last3"] == pytest.approx(16 / 3)
    assert h["acceptance_frozen_last3"] == pytest.approx(3.0)
    assert h["acceptance_ratio_online_vs_frozen"] == pytest.approx(16 / 9)
    assert h["acceptance_frozen_first"] == 4.0
    # Paired: the TLT run's own scores of its online and initial drafter, last three steps.
    assert h["paired_est_acceptance_last3"] == {"online": pytest.approx(19 / 3), "frozen": 2.0}
    assert h["paired_acceptance_ratio_online_vs_frozen"] == pytest.approx(19 / 6)
    assert h["paired_coupled_acceptance_ratio_online_vs_frozen"] == pytest.approx(22 / 9)
    assert h["paired_chain_acceptance_last3"] == {"online": pytest.approx(13 / 3), "frozen": 2.5}
    assert h["rollout_time_ratio_tlt_vs_baseline"] == pytest.approx(10 / 16)
    assert h["tail_extension_s"]["tlt_spot_overrun_max"] == pytest.approx(0.2)
    assert h["tail_extension_s"]["drafter_step_s_max"] == 0.3
    assert h["tail_extension_s"]["tlt_stops_in_background"] == 2.0  # steps 2 and 4
    assert h["idle_share_used_for_training"] == pytest.approx(0.5)
    table = format_table(runs)
    assert len(table.splitlines()) == 2 + 4 and "5.33" not in table  # one line per step, no averages


def test_acceptance_per_strategy_compares_the_drafters_at_one_strategy(tmp_path):
    metrics = _metrics(1, 3.0)
    metrics["tlt/sd/strategy_acceptance/4_1_4"] = 4.0
    metrics["tlt/sd/strategy_acceptance/2_1_2"] = 2.5
    (row,) = step_rows([metrics], {}, {})
    assert row["sd_strategy_acceptance"] == {"4_1_4": 4.0, "2_1_2": 2.5}
    runs = {
        "baseline": _rows([4.0] * 3, None),
        "tlt": _rows([3.0] * 3, [3.0] * 3),
        "frozen": _rows([3.0] * 3, [3.0] * 3),
    }
    for i, (online, fixed) in enumerate([(4.0, 3.0), (4.5, 3.0), (5.0, 2.0)]):
        runs["tlt"][i]["sd_strategy_acceptance"] = {"4_1_4": online, "2_1_2": 2.0}
        runs["frozen"][i]["sd_strategy_acceptance"] = {"4_1_4": fixed}
    by_strategy = headline(runs)["acceptance_by_strategy_last3"]
    assert by_strategy["4_1_4"] == {"online": 4.5, "frozen": pytest.approx(8 / 3), "ratio": pytest.approx(13.5 / 8)}
    assert by_strategy["2_1_2"] == {"online": 2.0, "frozen": None, "ratio": None}  # the frozen run never chose it
    assert headline(runs)["acceptance_ratio_online_vs_frozen"] == pytest.approx(1.0)  # the mixed numbers hide it


def test_headline_without_acceptance_reports_none_not_a_number():
    runs = {"baseline": _rows([1.0], None), "tlt": _rows([1.0], None), "frozen": _rows([1.0], None)}
    assert headline(runs)["acceptance_ratio_online_vs_frozen"] is None


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from verl_tlt.quickstart.plot import plot_comparison

    runs = {
        "baseline": _rows([4.0, 4.0], None),
        "tlt": _rows([3.0, 2.0], [4.0, 5.0]),
        "frozen": _rows([3.5, 3.5], [4.0, 3.0]),
    }
    for rows in runs.values():
        for row in rows:
            row["compact_share"] = 0.2
    out = plot_comparison(runs, tmp_path / "plot.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_read_trace_skips_validation_records(tmp_path):
    path = tmp_path / "trace.jsonl"
    lines = [
        {"replica": 0, "rollout_index": 0, "validation": False},
        {"replica": 0, "rollout_index": None, "validation": True},
        {"replica": 0, "rollout_index": 1},  # written before records were marked
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert sorted(read_trace(path)) == [0, 1]


def test_group_drafts_headline_compares_the_last_three_steps_with_the_drafter_alone(tmp_path):
    metrics = _metrics(1, 3.0)
    metrics["tlt/sd/source/suffix/draft_share"] = 0.75
    metrics["tlt/sd/source/mixed/acceptance_length"] = 6.0
    (row,) = step_rows([metrics], {}, {})
    assert row["sd_source"] == {"suffix/draft_share": 0.75, "mixed/acceptance_length": 6.0}
    runs = {
        "tlt": _rows([3.0, 3.0, 2.0, 2.0], [4.0, 3.0, 3.0, 3.0]),
        "tlt_group": _rows([3.0, 2.0, 2.0, 1.0], [4.0] * 4),
    }
    for i, row in enumerate(runs["tlt_group"]):
        row["sd_source"] = {
            "suffix/draft_share": 0.5 + 0.1 * i,
            "suffix/accept_rate": 0.9,
            "suffix/acceptance_length": 6,
        }
    group = group_drafts_headline(runs, "tlt_group", "tlt")
    assert group["acceptance_ratio_group_vs_eagle"] == pytest.approx(4 / 3)
    assert group["rollout_s_last3"] == {"group": 5.0, "eagle": 7.0}
    assert group["rollout_time_ratio_group_vs_eagle"] == pytest.approx(5 / 7)
    assert group["rollout_time_ratio_group_vs_eagle_all_steps"] == pytest.approx(8 / 10)
    assert group["suffix_draft_share_last3"] == pytest.approx(0.7)
    assert group["acceptance_by_source_last3"] == {"eagle": None, "suffix": 6.0, "mixed": None}


def test_rows_carry_the_rollout_share_of_the_step_and_the_shape_of_its_tail():
    records = [
        {**_trace_record(0, 0, 100.0, [101.0, 102.0, 110.0], 111.0), "response_tokens": [10, 20, 200]},
        {**_trace_record(0, 1, 100.0, [101.0, 101.5], 111.0), "response_tokens": [12, 14]},
    ]
    (row,) = step_rows([_metrics(1, None)], {0: records}, {}, toy_styles=False)
    assert row["rollout_s"] == pytest.approx(10.0) and row["rollout_share"] == pytest.approx(10.0 / 10.0)
    # Five finishes at 1, 1, 1.5, 2, 10 s: 90% (the fifth, nearest rank) at 10 s, so the tail share is 0.
    assert row["tail_last_10pct_share"] == 0.0
    assert (row["tail_response_len_p50"], row["tail_response_len_max"]) == (14.0, 200.0)
    assert "compact_share" not in row  # a real model's responses have no toy style


def test_the_table_shows_the_rollouts_share_and_the_tail_and_the_compact_share_only_for_the_toy():
    runs = {
        "baseline": _rows([4.0, 5.0], None),
        "tlt": _rows([3.0, 4.0], [2.0, 2.0]),
        "frozen": _rows([3.5, 3.5], [2.0, 2.0]),
    }
    for name in runs:
        for row in runs[name]:
            row["rollout_share"] = row["rollout_s"] / row["step_s"]
    runs["baseline"][0].update(tail_response_len_p50=77.0, tail_response_len_p90=256.0, tail_response_len_max=256.0)
    header, _, first, second = format_table(runs).splitlines()
    assert "rollout % base/tlt" in header and "tokens p50/p90/max" in header and "compact share" not in header
    assert "40%/30%" in first and "77/256/256" in first and "-/-/-" in second
    runs["tlt"][0]["compact_share"] = 0.25
    assert "compact share" in format_table(runs).splitlines()[0]


def test_the_policys_view_and_the_controls_spread_reach_the_headline():
    metrics = _metrics(1, 3.0)
    metrics.update(
        {
            "tlt/sd/unpaid_plain_steps": 40.0,
            "tlt/sd/cannot_pay_replicas": 1.0,
            "tlt/sd/predicted_rate/4_1_4": 9.0,
            "tlt/sd/observed_rate/4_1_4": 8.5,
        }
    )
    (row,) = step_rows([metrics], {}, {})
    assert row["sd_unpaid_plain_steps"] == 40 and row["sd_rates"] == {"4_1_4": {"predicted": 9.0, "observed": 8.5}}
    runs = {
        "baseline": _rows([4.0] * 2, None),
        "tlt": _rows([3.0] * 2, [3.0] * 2),
        "frozen": _rows([3.0] * 2, [3.0] * 2),
        "baseline_repeat": _rows([5.0] * 2, None),
    }
    runs["tlt"][0].update(sd_unpaid_plain_steps=40.0, sd_cannot_pay_replicas=1.0, sd_rates=row["sd_rates"])
    runs["tlt"][1].update(sd_unpaid_plain_steps=10.0, sd_cannot_pay_replicas=0.0)
    h = headline(runs)
    assert h["control_rollout_time_ratio"] == pytest.approx(10 / 8)
    assert h["unpaid_plain_steps"] == 50 and h["cannot_pay_steps"] == 1
    assert h["arm_rates_last"] == {"4_1_4": {"predicted": 9.0, "observed": 8.5}}
    del runs["baseline_repeat"]
    assert headline(runs)["control_rollout_time_ratio"] is None


def test_the_same_sample_scores_are_the_last_three_the_run_reported_wherever_they_were():
    """Bursts finish a score when an idle window lets them: here at steps 1, 2 and 4 of 6, none in the last two."""
    tlt = _rows([3.0] * 6, [4.0, 5.0, 5.0, 6.0, 6.0, 6.0])
    for row in (tlt[2], tlt[4], tlt[5]):
        for key in [k for k in row if k.startswith("drafter_eval_")]:
            del row[key]
    runs = {"baseline": _rows([4.0] * 6, None), "tlt": tlt, "frozen": _rows([3.5] * 6, [4.0] * 6)}
    h = headline(runs)
    assert h["paired_est_acceptance_last3"] == {"online": pytest.approx((5 + 6 + 7) / 3), "frozen": 2.0}
    assert h["paired_chain_acceptance_last3"] == {"online": pytest.approx((3 + 4 + 5) / 3), "frozen": 2.5}
