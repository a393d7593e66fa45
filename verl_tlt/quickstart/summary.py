"""The quickstart's comparison: per-step rows for each run (baseline, TLT, TLT with a frozen drafter) and the
headline ratios, from verl's metrics, the torch rollout's traces and verl's rollout dumps. Pure functions.

Rollout time is measured by the rollout servers (first request in to last response out), not by verl's
`timing_s/gen`, which also contains the replay buffer's polling (every 2 s in verl 0.9.1) and so hides a few
seconds of difference on the toy's short rollouts. Tail extension is the time from the last response finishing
to verl putting the replicas to sleep (the rollout phase being over).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from verl_tlt.metrics.long_tail import long_tail_metrics
from verl_tlt.metrics.rollout_trace import rollout_summary, rollout_weights_sha256
from verl_tlt.quickstart.recipe import CONTROL
from verl_tlt.toy.task import COMPACT, response_style

# Step-time parts verl times separately (timing_s/<part>); the rest of timing_s/step is "other".
STEP_PARTS = ("gen", "old_log_prob", "adv", "update_actor", "update_weights")
LAST_STEPS = 3
STRATEGY_ACCEPTANCE = "tlt/sd/strategy_acceptance/"
SOURCE_METRICS = "tlt/sd/source/"
PREDICTED_RATE, OBSERVED_RATE = "tlt/sd/predicted_rate/", "tlt/sd/observed_rate/"


def read_trace(path: Path) -> dict[int, list[dict]]:
    """Training rollout index -> the replicas' records of that rollout (see rollout_trace.RolloutTrace)."""
    by_rollout: dict[int, list[dict]] = defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                if not record.get("validation"):
                    by_rollout[record["rollout_index"]].append(record)
    return dict(by_rollout)


def step_rows(
    metrics: list[dict], trace: dict[int, list[dict]], rollouts: dict[int, list[dict]], toy_styles: bool = True
) -> list[dict]:
    """One row per training step. rollouts: step -> verl's dumped samples of that step (input, output, score).
    toy_styles: the responses are the toy's, whose compact share is reported (the drift the toy reward drives)."""
    rows = []
    for index, m in enumerate(metrics):
        step = m["step"]
        records = trace.get(index, [])
        outputs = [sample["output"] for sample in rollouts.get(step, [])]
        row: dict[str, Any] = {"step": step, "step_s": m.get("timing_s/step")}
        for part in STEP_PARTS:
            row[f"{part}_s"] = m.get(f"timing_s/{part}", 0.0)
        row["other_s"] = (row["step_s"] or 0.0) - sum(row[f"{part}_s"] for part in STEP_PARTS)
        summary = rollout_summary(records)
        if summary:
            row["rollout_s"] = summary["last_finish"] - summary["start"]
            row["tail_extension_s"] = summary["closed"] - summary["last_finish"]
            if row["step_s"]:
                row["rollout_share"] = row["rollout_s"] / row["step_s"]  # of the step: what TLT can shorten
            row.update(tail_shape(records, summary["start"]))
            if "engine_busy_s" in summary:  # summed over replicas; when the last request reached a replica
                row["engine_busy_s"] = summary["engine_busy_s"]
                row["last_submit_s"] = summary["last_submit"] - summary["start"]
        # The weights the replicas sampled this step with (bitwise checksum, None if unknown or if they disagree).
        row["weights_sha256"] = rollout_weights_sha256(records)
        if len({r.get("weights_sha256") for r in records} - {None}) > 1:
            row["weights_replicas_differ"] = True
        row["reward_mean"] = m.get("critic/score/mean")
        row["response_len_mean"] = m.get("response_length/mean")
        if toy_styles:
            row["compact_share"] = (
                sum(response_style(o) == COMPACT for o in outputs) / len(outputs) if outputs else None
            )
        for key in (
            "tlt/sd/acceptance_length",
            "tlt/sd/step_share",
            "tlt/drafter/version",
            "tlt/drafter/total_steps",
            "tlt/drafter/top1_accuracy",
            "tlt/drafter/step_s",
            "tlt/spot/idle_replica_s",
            "tlt/spot/trained_replica_s",
            "tlt/spot/overrun_s",
            "tlt/spot/stops_in_background",
            "tlt/capture/total_s",
            "tlt/drafter/eval_online_top1_accuracy",
            "tlt/drafter/eval_frozen_top1_accuracy",
            "tlt/drafter/eval_online_accept_prob",
            "tlt/drafter/eval_frozen_accept_prob",
            "tlt/drafter/eval_online_est_acceptance_length",
            "tlt/drafter/eval_frozen_est_acceptance_length",
            "tlt/drafter/eval_online_est_coupled_acceptance_length",
            "tlt/drafter/eval_frozen_est_coupled_acceptance_length",
            "tlt/drafter/eval_online_chain_acceptance_length",
            "tlt/drafter/eval_frozen_chain_acceptance_length",
            "tlt/sd/unpaid_plain_steps",
            "tlt/sd/cannot_pay_replicas",
        ):
            if key in m:
                row[key.removeprefix("tlt/").replace("/", "_")] = m[key]
        row.update(_sd_breakdowns(m))
        rows.append(row)
    return rows


def _sd_breakdowns(m: dict) -> dict[str, dict]:
    """A step's per-strategy acceptance, per-source draft metrics and per-arm predicted / observed rates (those
    present)."""
    found: dict[str, dict] = {}
    by_strategy = {k.removeprefix(STRATEGY_ACCEPTANCE): v for k, v in m.items() if k.startswith(STRATEGY_ACCEPTANCE)}
    if by_strategy:
        found["sd_strategy_acceptance"] = by_strategy
    by_source = {k.removeprefix(SOURCE_METRICS): v for k, v in m.items() if k.startswith(SOURCE_METRICS)}
    if by_source:
        found["sd_source"] = by_source
    rates = {
        k.removeprefix(PREDICTED_RATE): {
            "predicted": v,
            "observed": m.get(OBSERVED_RATE + k.removeprefix(PREDICTED_RATE)),
        }
        for k, v in m.items()
        if k.startswith(PREDICTED_RATE)
    }
    if rates:
        found["sd_rates"] = rates
    return found


def tail_shape(records: list[dict], start: float) -> dict[str, float]:
    """The rollout's long tail from the replicas' records: the share of the rollout after 90% of responses finished,
    and response-length percentiles (metrics.long_tail)."""
    if not all("response_tokens" in r for r in records):  # records written before they carried lengths
        return {}
    finishes = [t - start for r in records for t in r["finish_times"]]
    lengths = [n for r in records for n in r["response_tokens"]]
    if not finishes or len(finishes) != len(lengths):
        return {}
    tail = long_tail_metrics(finishes, lengths)
    keys = ("last_10pct_share", "response_len_p50", "response_len_p90", "response_len_max")
    return {f"tail_{key}": tail[f"tlt/tail/{key}"] for key in keys}


def _last_scores_mean(rows: list[dict], key: str) -> float | None:
    """Mean of the last LAST_STEPS values of `key` the run reported, wherever they were: the bursts finish a score
    when an idle window lets them (a step's captures are scored at a later step), so most steps report none."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return _mean(values[-LAST_STEPS:])


def _last_mean(rows: list[dict], key: str, sub_key: str | None = None) -> float | None:
    """Mean of rows[i][key] (or rows[i][key][sub_key]) over the last LAST_STEPS rows that have it."""
    values = [r.get(key) for r in rows[-LAST_STEPS:]]
    if sub_key is not None:
        values = [v.get(sub_key) if v is not None else None for v in values]
    return _mean(values)


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def headline(runs: dict[str, list[dict]]) -> dict[str, Any]:
    """The headline numbers the quickstart prints, from the rows of the runs 'baseline', 'tlt' and 'frozen'."""
    base, tlt, frozen = runs["baseline"], runs["tlt"], runs["frozen"]
    online_last = _last_mean(tlt, "sd_acceptance_length")
    frozen_last = _last_mean(frozen, "sd_acceptance_length")
    base_rollout = sum(r.get("rollout_s") or 0.0 for r in base)
    tlt_rollout = sum(r.get("rollout_s") or 0.0 for r in tlt)
    overruns = [r.get("spot_overrun_s") for r in tlt if r.get("spot_overrun_s") is not None]
    drafter_steps = [r.get("drafter_step_s") for r in tlt if r.get("drafter_step_s") is not None]
    idle = sum(r.get("spot_idle_replica_s") or 0.0 for r in tlt)
    trained = sum(r.get("spot_trained_replica_s") or 0.0 for r in tlt)
    # The same comparison on the same samples: the TLT run scores its online drafter and its initial one on every
    # step's fresh captures (teacher-forced estimate), so both face exactly the same policy.
    paired_online = _last_scores_mean(tlt, "drafter_eval_online_est_acceptance_length")
    paired_frozen = _last_scores_mean(tlt, "drafter_eval_frozen_est_acceptance_length")
    # The engine's acceptance mixes strategies in the proportions each run's policy chose (a chain of 2 caps it at
    # 3, one of 4 at 5); per strategy, the two drafters compare at equal footing.
    strategies = sorted({name for r in tlt + frozen for name in r.get("sd_strategy_acceptance", {})})
    by_strategy = {}
    for name in strategies:
        online = _last_mean(tlt, "sd_strategy_acceptance", name)
        fixed = _last_mean(frozen, "sd_strategy_acceptance", name)
        by_strategy[name] = {"online": online, "frozen": fixed, "ratio": _ratio(online, fixed)}
    summary = {
        "acceptance_ratio_online_vs_frozen": _ratio(online_last, frozen_last),
        "acceptance_by_strategy_last3": by_strategy,
        "paired_acceptance_ratio_online_vs_frozen": _ratio(paired_online, paired_frozen),
        "paired_est_acceptance_last3": {"online": paired_online, "frozen": paired_frozen},
        # The same for a keyed chain of 4 drafted from the drafter's own features, as the engine drafts it.
        "paired_chain_acceptance_last3": {
            "online": _last_scores_mean(tlt, "drafter_eval_online_chain_acceptance_length"),
            "frozen": _last_scores_mean(tlt, "drafter_eval_frozen_chain_acceptance_length"),
        },
        # The same, for drafts made under the rollout's keyed (shared-noise) sampling rather than greedily.
        "paired_coupled_acceptance_ratio_online_vs_frozen": _ratio(
            _last_scores_mean(tlt, "drafter_eval_online_est_coupled_acceptance_length"),
            _last_scores_mean(tlt, "drafter_eval_frozen_est_coupled_acceptance_length"),
        ),
        "acceptance_online_last3": online_last,
        "acceptance_frozen_last3": frozen_last,
        "acceptance_frozen_first": frozen[0].get("sd_acceptance_length") if frozen else None,
        "rollout_time_ratio_tlt_vs_baseline": _ratio(tlt_rollout, base_rollout),
        "rollout_time_s": {
            "baseline": base_rollout,
            "tlt": tlt_rollout,
            "frozen": sum(r.get("rollout_s") or 0.0 for r in frozen),
        },
        "step_time_ratio_tlt_vs_baseline": _ratio(sum(r["step_s"] for r in tlt), sum(r["step_s"] for r in base)),
        # The spread the machine itself gives: TLT off twice, same config.
        "control_rollout_time_ratio": _ratio(sum(r.get("rollout_s") or 0.0 for r in runs[CONTROL]), base_rollout)
        if runs.get(CONTROL)
        else None,
        # The policy's view: decode steps kept plain because no drafter arm was predicted to pay, steps at which a
        # replica's drafter could not pay at all, and the last step's predicted and observed rate per arm.
        "unpaid_plain_steps": sum(r.get("sd_unpaid_plain_steps") or 0.0 for r in tlt),
        "cannot_pay_steps": sum(bool(r.get("sd_cannot_pay_replicas")) for r in tlt),
        "arm_rates_last": next((r["sd_rates"] for r in reversed(tlt) if r.get("sd_rates")), {}),
        "tail_extension_s": {
            "baseline_mean": _mean([r.get("tail_extension_s") for r in base]),
            "tlt_mean": _mean([r.get("tail_extension_s") for r in tlt]),
            "tlt_spot_overrun_max": max(overruns, default=0.0),
            "drafter_step_s_max": max(drafter_steps, default=None),
            # Stops whose step in progress outlasted the stop's wait (CPU workers end it at idle priority).
            "tlt_stops_in_background": sum(r.get("spot_stops_in_background") or 0.0 for r in tlt),
        },
        "idle_replica_s": idle,
        "idle_share_used_for_training": trained / idle if idle else 0.0,
        "compact_share_first_last": {
            name: (rows[0].get("compact_share"), rows[-1].get("compact_share")) for name, rows in runs.items() if rows
        },
    }
    return summary


def group_drafts_headline(runs: dict[str, list[dict]], group_run: str, eagle_run: str) -> dict[str, Any]:
    """Group drafts (run `group_run`) against the drafter alone (`eagle_run`): acceptance length and rollout time over
    the last LAST_STEPS steps, their ratios, and the suffix drafts' share and acceptance there. Both runs sample the
    same responses while their weights stay bitwise equal (the identity check says at which steps)."""
    group, eagle = runs[group_run], runs[eagle_run]
    group_rollout = sum(r.get("rollout_s") or 0.0 for r in group[-LAST_STEPS:])
    eagle_rollout = sum(r.get("rollout_s") or 0.0 for r in eagle[-LAST_STEPS:])
    group_accept, eagle_accept = _last_mean(group, "sd_acceptance_length"), _last_mean(eagle, "sd_acceptance_length")
    return {
        "acceptance_last3": {"group": group_accept, "eagle": eagle_accept},
        "acceptance_ratio_group_vs_eagle": _ratio(group_accept, eagle_accept),
        "rollout_s_last3": {"group": group_rollout, "eagle": eagle_rollout},
        "rollout_time_ratio_group_vs_eagle": _ratio(group_rollout, eagle_rollout),
        "rollout_time_ratio_group_vs_eagle_all_steps": _ratio(
            sum(r.get("rollout_s") or 0.0 for r in group), sum(r.get("rollout_s") or 0.0 for r in eagle)
        ),
        "suffix_draft_share_last3": _last_mean(group, "sd_source", "suffix/draft_share"),
        "suffix_accept_rate_last3": _last_mean(group, "sd_source", "suffix/accept_rate"),
        "acceptance_by_source_last3": {
            source: _last_mean(group, "sd_source", f"{source}/acceptance_length")
            for source in ("eagle", "suffix", "mixed")
        },
    }


def format_table(runs: dict[str, list[dict]]) -> str:
    """The per-step comparison: rollout and step seconds, the rollout's share of the step (what TLT can shorten),
    acceptance, the response-length tail (p50/p90/max tokens: the same samples in every run, so the baseline's), the
    compact share (the toy's drift; only where the responses are the toy's) and the reward."""
    toy = shows_toy_drift(runs)
    header = (
        f"{'step':>4} | {'rollout s base/tlt':>18} | {'step s base/tlt':>15} | {'rollout % base/tlt':>18} | "
        f"{'accept online/frozen':>20} | {'tokens p50/p90/max':>18} | "
        + (f"{'compact share':>13} | " if toy else "")
        + f"{'reward':>6}"
    )
    lines = [header, "-" * len(header)]
    for base, tlt, frozen in zip(runs["baseline"], runs["tlt"], runs["frozen"], strict=False):
        shares = "/".join(_percent(r.get("rollout_share")) for r in (base, tlt))
        tail = "/".join(_count(base.get(f"tail_response_len_{key}")) for key in ("p50", "p90", "max"))
        lines.append(
            f"{base['step']:>4} | {_fmt(base.get('rollout_s'))}/{_fmt(tlt.get('rollout_s')):<8} | "
            f"{_fmt(base['step_s'], 6)}/{_fmt(tlt['step_s']):<8} | {shares:>18} | "
            f"{_fmt(tlt.get('sd_acceptance_length'), 9)}/{_fmt(frozen.get('sd_acceptance_length')):<10} | "
            f"{tail:>18} | "
            + (f"{_fmt(tlt.get('compact_share'), 13)} | " if toy else "")
            + f"{_fmt(tlt.get('reward_mean'), 6)}"
        )
    return "\n".join(lines)


def shows_toy_drift(runs: dict[str, list[dict]]) -> bool:
    """Whether the TLT run's rows carry the toy's compact share (a real model's responses have no such style)."""
    return any(r.get("compact_share") is not None for r in runs["tlt"])


def _percent(share: float | None) -> str:
    return f"{100 * share:.0f}%" if isinstance(share, (int, float)) else "-"


def _count(value: float | None) -> str:
    return f"{value:.0f}" if isinstance(value, (int, float)) else "-"


def _fmt(value: float | None, width: int = 9) -> str:
    return f"{value:>{width}.2f}" if isinstance(value, (int, float)) else f"{'-':>{width}}"


def format_decode_costs(decode: dict[str, dict[str, dict[str, float]]]) -> str:
    """Decode ms per token by batch-size group, one column per run and kind (plain / SD), as printed by the
    quickstart; decode: run -> `ms_per_token_by_batch` of its rollouts."""
    columns = [
        (run, kind)
        for run, groups in decode.items()
        for kind in ("plain", "sd")
        if any(kind in g for g in groups.values())
    ]
    groups = sorted({int(g) for groups in decode.values() for g in groups})
    lines = ["batch >= | " + " | ".join(f"{run} {kind}".rjust(14) for run, kind in columns)]
    for group in groups:
        cells = [decode[run].get(str(group), {}).get(kind) for run, kind in columns]
        lines.append(f"{group:8d} | " + " | ".join(_fmt(cell, 14) for cell in cells))
    return "\n".join(lines)
