"""The quickstart's printed report: the identity lines with the control beside them, the violation banner, and the
stage timings."""

from __future__ import annotations

from verl_tlt.quickstart.identity import identity_claim
from verl_tlt.quickstart.report import claim_text, control_text, format_report, format_stage_times, identity_lines


def _claim(weights: list[bool | None], responses: list[bool | None]) -> dict:
    steps = [
        {"step": i + 1, "weights_equal": w, "responses_equal": r}
        for i, (w, r) in enumerate(zip(weights, responses, strict=True))
    ]
    return identity_claim(steps)


HOLDS_THEN_DRIFTS = _claim([True] * 8 + [False] * 7, [True] * 8 + [False] * 6 + [True])
ALWAYS_EQUAL = _claim([True] * 15, [True] * 15)
VIOLATED = _claim([True] * 3, [True, False, True])


def test_the_headline_states_the_claim_and_where_weights_first_differed():
    text = claim_text(HOLDS_THEN_DRIFTS)
    assert "identical to the baseline's at every step whose rollout weights were bitwise equal" in text
    assert "(8/8)" in text and "weights first differed at step 9" in text and "1/7 from there" in text
    assert "weights bitwise equal at every step checked (15/15)" in claim_text(ALWAYS_EQUAL)


def test_a_violation_is_named_with_its_steps_and_blamed_on_tlt_except_in_the_control():
    assert "VIOLATION" in claim_text(VIOLATED) and "[2]" in claim_text(VIOLATED)
    assert "not lossless" in claim_text(VIOLATED)
    control = claim_text(VIOLATED, control=True)
    assert "not deterministic" in control and "not lossless" not in control


def test_the_report_shouts_when_any_run_violates_the_claim():
    lines = identity_lines({"tlt": VIOLATED, "baseline_repeat": ALWAYS_EQUAL}, control_ran=True)
    assert lines[1].startswith("!!! IDENTITY VIOLATED in ['tlt']")
    quiet = identity_lines({"tlt": HOLDS_THEN_DRIFTS, "baseline_repeat": ALWAYS_EQUAL}, control_ran=True)
    assert not any("VIOLATED" in line for line in quiet)
    assert any(line.startswith("  baseline_repeat (control") for line in quiet)


def test_the_control_line_says_whether_training_itself_is_reproducible():
    drifted_control = control_text({"tlt": HOLDS_THEN_DRIFTS, "baseline_repeat": HOLDS_THEN_DRIFTS}, control_ran=True)
    assert "not bitwise reproducible" in drifted_control and "step 9" in drifted_control
    steady_control = control_text({"tlt": HOLDS_THEN_DRIFTS, "baseline_repeat": ALWAYS_EQUAL}, control_ran=True)
    assert "kept bitwise-equal weights at every step, but ['tlt'] diverged" in steady_control
    assert "not run" in control_text({"tlt": HOLDS_THEN_DRIFTS}, control_ran=False)


def test_stage_timings_list_every_stage_in_order_and_the_total():
    text = format_stage_times({"setup (virtualenv)": 3.0, "toy world": 1.0, "verl run: baseline": 65.0})
    lines = text.splitlines()
    assert lines[0] == "stage timings:"
    assert [line.split()[0] for line in lines[1:]] == ["setup", "toy", "verl", "total"]
    assert lines[-1].endswith("1 min 09 s")  # 3 + 1 + 65 seconds
    assert "setup (virtualenv) not measured" in format_stage_times({"toy world": 1.0})


def test_a_partial_run_set_says_what_is_missing_instead_of_a_comparison():
    rows = [{"step": 1, "step_s": 10.0, "rollout_s": 2.0, "sd_acceptance_length": 2.5}]
    summary = {"runs": {"tlt": rows}, "identity": {}, "stage_s": {"verl run: tlt": 30.0}}
    text = format_report(summary)
    assert "partial run set ['tlt']" in text and "last acceptance length 2.50" in text
    assert "identity with the baseline: not checked" in text and "stage timings:" in text


def test_the_group_drafts_lines_give_both_ratios_and_the_controls_yardstick():
    rows = [{"step": 1, "step_s": 10.0, "rollout_s": 2.0, "sd_acceptance_length": 2.5}]
    group = {
        "acceptance_last3": {"group": 4.0, "eagle": 3.0},
        "acceptance_ratio_group_vs_eagle": 4 / 3,
        "rollout_s_last3": {"group": 5.0, "eagle": 6.0},
        "rollout_time_ratio_group_vs_eagle": 5 / 6,
        "rollout_time_ratio_group_vs_eagle_all_steps": 0.9,
        "suffix_draft_share_last3": 0.6,
        "suffix_accept_rate_last3": 0.8,
        "acceptance_by_source_last3": {"eagle": 3.0, "suffix": 6.0, "mixed": None},
        "control_rollout_time_ratio_last3": 1.05,
    }
    summary = {"runs": {"tlt": rows, "tlt_group": rows}, "identity": {}, "stage_s": {}, "group_drafts": group}
    text = format_report(summary)
    assert "acceptance length 4.00 vs 3.00 (ratio 1.33)" in text
    assert "by arm source: eagle 3.00, suffix 6.00, mixed n/a" in text
    assert "rollout time 5.00 s vs 6.00 s (ratio 0.83; all steps 0.90" in text and "last 3 steps: 1.05)" in text


def test_each_runs_peak_memory_per_component_is_printed_side_by_side():
    from verl_tlt.quickstart.memory_watch import GIB, PeakTracker

    peaks = {}
    for name, drafter in (("baseline", 0), ("tlt", GIB)):
        tracker = PeakTracker()
        tracker.add([("WorkerDict", 2 * GIB), ("DrafterWorker", drafter)], node_used_bytes=4 * GIB + drafter)
        peaks[name] = tracker.report()
    rows = [{"step": 1, "step_s": 10.0, "rollout_s": 2.0}]
    summary = {"runs": {"tlt": rows}, "identity": {}, "stage_s": {}, "memory_peaks": peaks}
    lines = format_report(summary).splitlines()
    start = lines.index("peak memory per component (PSS):")
    assert lines[start + 1].split() == ["component", "baseline", "tlt"]
    assert lines[start + 2].split() == ["WorkerDict", "2.00", "GiB", "2.00", "GiB"]
    assert lines[start + 3].split() == ["DrafterWorker", "0.00", "GiB", "1.00", "GiB"]
