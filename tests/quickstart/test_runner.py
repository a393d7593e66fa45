"""The quickstart's stage timing, the setup time handed over by the recipe script, and the summary it writes."""

from __future__ import annotations

import pytest

from verl_tlt.quickstart.runner import SETUP_SECONDS_ENV, RunResult, StageTimer, build_summary, setup_seconds


def test_stages_are_timed_in_the_order_they_ran():
    now = [0.0]
    timer = StageTimer(clock=lambda: now[0])
    timer.add("setup (virtualenv)", 3.04)
    with timer.stage("toy world"):
        now[0] = 1.25
    with timer.stage("verl run: baseline"):
        now[0] = 61.25
    assert timer.seconds == {"setup (virtualenv)": 3.0, "toy world": 1.2, "verl run: baseline": 60.0}
    assert list(timer.seconds) == ["setup (virtualenv)", "toy world", "verl run: baseline"]


def test_setup_seconds_come_from_the_recipe_script_and_a_bad_value_names_the_variable():
    assert setup_seconds({}) is None and setup_seconds({SETUP_SECONDS_ENV: ""}) is None
    assert setup_seconds({SETUP_SECONDS_ENV: "42"}) == 42.0
    for bad in ("soon", "-1", "nan"):
        with pytest.raises(ValueError, match=f"{SETUP_SECONDS_ENV}='{bad}' is not a number of seconds"):
            setup_seconds({SETUP_SECONDS_ENV: bad})


def _result(digests: list[str], outputs: list[str], acceptance: float | None = None) -> RunResult:
    rows = []
    for i, digest in enumerate(digests):
        row = {"step": i + 1, "step_s": 10.0, "rollout_s": 4.0, "tail_extension_s": 1.0, "weights_sha256": digest}
        if acceptance is not None:
            row["sd_acceptance_length"] = acceptance
        rows.append(row)
    responses = {i + 1: [("p", o)] for i, o in enumerate(outputs)}
    return RunResult(rows=rows, responses=responses, decode={}, wall_s=100.0)


def test_the_summary_holds_the_identity_of_every_run_and_the_stage_timings():
    results = {
        "baseline": _result(["w1", "w2"], ["a", "b"]),
        "tlt": _result(["w1", "w2"], ["a", "b"], acceptance=2.0),
        "frozen": _result(["w1", "w2"], ["a", "X"], acceptance=1.5),  # equal weights, other responses
        "baseline_repeat": _result(["w1", "v2"], ["a", "c"]),
    }
    stage_s = {"toy world": 1.0, "verl run: baseline": 100.0}
    summary = build_summary(results, stage_s, replicas=2, overrides=["x=1"], missing=[])
    assert summary["identity"]["tlt"]["holds"] is True
    assert summary["identity"]["frozen"]["violations"] == [2]
    assert summary["identity"]["baseline_repeat"]["weights_first_differ_step"] == 2
    assert summary["steps_with_baseline_responses"] == {"tlt": "2/2", "frozen": "1/2", "baseline_repeat": "1/2"}
    assert summary["stage_s"] == stage_s and "acceptance_ratio_online_vs_frozen" in summary


def test_a_partial_summary_has_no_headline_and_names_the_missing_runs():
    results = {"tlt": _result(["w1"], ["a"], acceptance=2.0)}
    summary = build_summary(results, {}, replicas=2, overrides=[], missing=["baseline", "frozen", "baseline_repeat"])
    assert "acceptance_ratio_online_vs_frozen" not in summary and summary["identity"] == {}
    assert summary["missing_runs"] == ["baseline", "frozen", "baseline_repeat"]
