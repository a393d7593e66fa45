"""The quickstart's printed report, from its summary (summary.json): the per-step table, the headline numbers, the
identity claim per run with the control beside it, and how long each stage took. Pure text formatting."""

from __future__ import annotations

from typing import Any

from verl_tlt.progress import format_duration
from verl_tlt.quickstart.memory_watch import format_memory_table
from verl_tlt.quickstart.recipe import BASELINE, COMPARED, CONTROL, GROUP_DRAFTS, SETUP_STAGE
from verl_tlt.quickstart.summary import format_decode_costs, format_table


def format_report(summary: dict[str, Any]) -> str:
    """Everything the quickstart prints after its runs, as one text."""
    runs = summary["runs"]
    lines = []
    if all(name in runs for name in COMPARED):
        lines += [format_table(runs), "", *headline_lines(summary)]
    else:
        lines.append(f"partial run set {list(runs)}: no comparison table or headline (they need {list(COMPARED)})")
        lines += [_run_digest(name, rows) for name, rows in runs.items()]
    if summary.get("group_drafts"):
        lines += ["", *group_drafts_lines(summary["group_drafts"])]
    lines += ["", *identity_lines(summary.get("identity", {}), control_ran=CONTROL in runs)]
    if summary.get("identity_note"):
        lines.append(f"  note: {summary['identity_note']}")
    if summary.get("memory_peaks"):
        lines += ["", "peak memory per component (PSS):", format_memory_table(summary["memory_peaks"])]
    if summary.get("quickstart_memory"):
        lines.append(quickstart_memory_line(summary["quickstart_memory"]))
    lines += ["", format_stage_times(summary.get("stage_s", {}))]
    return "\n".join(lines)


def identity_lines(identity: dict[str, dict[str, Any]], *, control_ran: bool) -> list[str]:
    """One line per run against the baseline, a violation banner if any, and what the control says."""
    if not identity:
        return [f"identity with the baseline: not checked (no {BASELINE!r} run)"]
    lines = ["identity with the baseline (rollout weights by checksum, sampled responses by content):"]
    for name, claim in identity.items():
        label = f"{name} (control: TLT off, same config)" if name == CONTROL else name
        lines.append(f"  {label}: {claim_text(claim, control=name == CONTROL)}")
    violators = [name for name, claim in identity.items() if claim["violations"]]
    if violators:
        lines.insert(0, "!" * 100)
        lines.insert(1, f"!!! IDENTITY VIOLATED in {violators}: different responses from bitwise-equal weights")
        lines.insert(2, "!" * 100)
    lines.append(f"  {control_text(identity, control_ran=control_ran)}")
    return lines


def claim_text(claim: dict[str, Any], *, control: bool = False) -> str:
    """A run's identity claim in words (see identity.identity_claim)."""
    equal, identical = claim["weights_equal_steps"], claim["responses_equal_at_equal_weights"]
    first, total = claim["weights_first_differ_step"], claim["num_steps"]
    if claim["violations"]:
        why = (
            "the rollout is not deterministic given its weights (TLT is off here: not TLT's doing)"
            if control
            else "speculative decoding was not lossless: a TLT bug, please report it"
        )
        return (
            f"VIOLATION: responses differ from the baseline's at step(s) {claim['violations']} although the rollout "
            f"weights were bitwise equal ({identical}/{equal} equal-weight steps identical); {why}"
        )
    if equal == 0 and first is None:
        return (
            f"no weight checksums to compare (rollout traces missing them); responses equal to the baseline's at "
            f"{claim['responses_equal_steps']}/{total} steps, the cause of any difference unknown"
        )
    if claim["holds"]:
        text = (
            "sampled responses identical to the baseline's at every step whose rollout weights were bitwise equal "
            f"to the baseline's ({identical}/{equal})"
        )
    else:
        text = (
            f"sampled responses identical to the baseline's at {identical}/{equal} steps whose rollout weights were "
            f"bitwise equal to the baseline's (the others lack a rollout dump to compare)"
        )
    if first is None:
        return text + f"; weights bitwise equal at every step checked ({equal}/{total})"
    after = [s for s in claim["steps"] if s["step"] >= first]
    same_after = sum(s["responses_equal"] is True for s in after)
    return text + f"; weights first differed at step {first} (responses equal at {same_after}/{len(after)} from there)"


def control_text(identity: dict[str, dict[str, Any]], *, control_ran: bool) -> str:
    """What the control run says about the other runs' differences from the baseline."""
    if not control_ran or CONTROL not in identity:
        return f"control: not run ({CONTROL!r} not in --runs), so whether training is reproducible here is unchecked"
    control = identity[CONTROL]
    diverged = [n for n, c in identity.items() if n != CONTROL and c["weights_first_differ_step"] is not None]
    if control["weights_first_differ_step"] is not None:
        return (
            f"control: with TLT off, the same config's weights also diverged from the baseline's (first at step "
            f"{control['weights_first_differ_step']}): training here is not bitwise reproducible run to run even with "
            "batches in slot order, so responses that differ once weights differ are not evidence against TLT"
        )
    if control["weights_equal_steps"] == 0:
        return "control: no weight checksums to compare"
    if diverged:
        return (
            f"control: the repeated baseline kept bitwise-equal weights at every step, but {diverged} diverged: "
            "training came out differently from identical samples there: something in that run changed how the "
            "actor trains, not what was sampled"
        )
    return "control: the repeated baseline, like every run, kept bitwise-equal weights at every step"


def format_stage_times(stage_s: dict[str, float]) -> str:
    """`stage timings:` then one line per stage, then the total."""
    if not stage_s:
        return "stage timings: none recorded"
    width = max(len(name) for name in stage_s)
    lines = ["stage timings:"]
    lines += [f"  {name:<{width}}  {format_duration(seconds):>12}" for name, seconds in stage_s.items()]
    lines.append(f"  {'total':<{width}}  {format_duration(sum(stage_s.values())):>12}")
    if SETUP_STAGE not in stage_s:
        lines.append(f"  ({SETUP_STAGE} not measured: recipes/quickstart_cpu.sh measures it)")
    return "\n".join(lines)


def arm_rate_lines(rates: dict[str, dict[str, float | None]]) -> list[str]:
    """The TLT run's last step: each arm's predicted and observed committed tokens per request-second."""
    if not rates:
        return []

    def show(value):
        return "-" if value is None else f"{value:.1f}"

    cells = ", ".join(f"{arm} {show(r.get('predicted'))}/{show(r.get('observed'))}" for arm, r in sorted(rates.items()))
    return [f"  predicted / observed tokens per request-second, last step: {cells}"]


def headline_lines(summary: dict[str, Any]) -> list[str]:
    """The headline numbers of the baseline / TLT / frozen comparison (see summary.headline)."""

    def show(value):
        return "n/a" if value is None else f"{value:.2f}"

    tail = summary["tail_extension_s"]
    paired, chain = summary["paired_est_acceptance_last3"], summary["paired_chain_acceptance_last3"]
    lines = [
        f"acceptance length, mean of the last 3 steps: online {show(summary['acceptance_online_last3'])} vs "
        f"frozen {show(summary['acceptance_frozen_last3'])} "
        f"(ratio {show(summary['acceptance_ratio_online_vs_frozen'])}; frozen at step 1: "
        f"{show(summary['acceptance_frozen_first'])})"
    ]
    for name, scores in summary["acceptance_by_strategy_last3"].items():
        lines.append(
            f"  {name} steps only: online {show(scores['online'])} vs frozen {show(scores['frozen'])} "
            f"(ratio {show(scores['ratio'])})"
        )
    lines += [
        f"same samples (TLT run, teacher-forced estimate, the last 3 scores): online {show(paired['online'])} vs "
        f"initial drafter {show(paired['frozen'])} (ratio {show(summary['paired_acceptance_ratio_online_vs_frozen'])};"
        f" for keyed drafts {show(summary['paired_coupled_acceptance_ratio_online_vs_frozen'])})",
        f"  keyed chain of 4 from the drafter's own features (the engine's 4_1_4): online {show(chain['online'])} vs "
        f"initial drafter {show(chain['frozen'])}",
        f"rollout time TLT / baseline: {show(summary['rollout_time_ratio_tlt_vs_baseline'])} "
        f"(server-measured, all steps; the control's baseline repeat / baseline: "
        f"{show(summary.get('control_rollout_time_ratio'))}); step time TLT / baseline: "
        f"{show(summary['step_time_ratio_tlt_vs_baseline'])}",
        f"policy: {summary.get('unpaid_plain_steps', 0):.0f} decode steps plain because no drafter arm was predicted "
        f"to pay; steps with a replica whose drafter could not pay: {summary.get('cannot_pay_steps', 0)}",
        *arm_rate_lines(summary.get("arm_rates_last") or {}),
        f"tail extension (last response -> replicas asleep), mean: baseline {show(tail['baseline_mean'])} s, "
        f"TLT {show(tail['tlt_mean'])} s; spot training ran on after the last response for at most "
        f"{show(tail['tlt_spot_overrun_max'])} s (one drafter step: {show(tail['drafter_step_s_max'])} s; "
        f"{tail.get('tlt_stops_in_background', 0):.0f} stops left their step to end in the background)",
        "decode ms per committed token by running batch size (plain / speculative steps):",
        format_decode_costs(summary["decode_ms_per_token_by_batch"]),
        f"idle replica-seconds {summary['idle_replica_s']:.1f}, of which used for drafter training "
        f"{100 * summary['idle_share_used_for_training']:.0f}%",
    ]
    return lines


def group_drafts_lines(group: dict[str, Any]) -> list[str]:
    """Group drafts against the drafter alone (see summary.group_drafts_headline)."""

    def show(value):
        return "n/a" if value is None else f"{value:.2f}"

    accept, rollout = group["acceptance_last3"], group["rollout_s_last3"]
    by_source = ", ".join(f"{name} {show(value)}" for name, value in group["acceptance_by_source_last3"].items())
    control = group.get("control_rollout_time_ratio_last3")
    return [
        f"group drafts ({GROUP_DRAFTS} run) vs the drafter alone (tlt run), last 3 steps, same samples while the "
        "weights are equal (identity below):",
        f"  acceptance length {show(accept['group'])} vs {show(accept['eagle'])} "
        f"(ratio {show(group['acceptance_ratio_group_vs_eagle'])}); by arm source: {by_source}",
        f"  suffix drafts: {show(group['suffix_draft_share_last3'])} of draft tokens, "
        f"{show(group['suffix_accept_rate_last3'])} of them accepted",
        f"  rollout time {show(rollout['group'])} s vs {show(rollout['eagle'])} s "
        f"(ratio {show(group['rollout_time_ratio_group_vs_eagle'])}; all steps "
        f"{show(group['rollout_time_ratio_group_vs_eagle_all_steps'])}; the control's baseline repeat / baseline, "
        f"last 3 steps: {show(control)})",
    ]


def _run_digest(name: str, rows: list[dict]) -> str:
    rollout = sum(r.get("rollout_s") or 0.0 for r in rows)
    step = sum(r.get("step_s") or 0.0 for r in rows)
    share = f" ({100 * rollout / step:.0f}% of step time)" if step else ""
    accepted = [r["sd_acceptance_length"] for r in rows if r.get("sd_acceptance_length") is not None]
    last = f", last acceptance length {accepted[-1]:.2f}" if accepted else ""
    tail = ""
    if any("tail_response_len_max" in r for r in rows):  # the long tail, pooled over the run's steps by its means
        mean = {key: _mean_of(rows, f"tail_{key}") for key in ("response_len_p50", "response_len_p90")}
        longest = max(r.get("tail_response_len_max") or 0 for r in rows)
        after_90 = _mean_of(rows, "tail_last_10pct_share")
        tail = (
            f"; response tokens p50 {mean['response_len_p50']:.0f}, p90 {mean['response_len_p90']:.0f}, max "
            f"{longest:.0f}; the last 10% of responses took {100 * after_90:.0f}% of the rollout (step means)"
        )
    return f"  {name}: {len(rows)} steps, rollout {rollout:.1f} s in all{share} (server-measured){last}{tail}"


def _mean_of(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else float("nan")


def quickstart_memory_line(memory: dict[str, dict[str, float]]) -> str:
    """The quickstart's own resident memory as the first verl run started, and its peak: its inputs are built in a
    child process (quickstart.apart), so the runs do not share the machine with what building them held."""
    start, end = memory.get("at_first_run_start", {}), memory.get("at_end", {})
    line = f"the quickstart itself (caller): {start.get('rss_gib', 0.0):.2f} GiB resident as the first run started"
    if "peak_rss_gib" in end:
        line += f", peak {end['peak_rss_gib']:.2f} GiB over the whole command (inputs built in a child process)"
    return line
