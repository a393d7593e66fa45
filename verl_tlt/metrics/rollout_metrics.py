"""One rollout's ``tlt/tail/*``, ``tlt/rollout/*`` and ``tlt/sd/*`` metrics, from every replica's rollout record
(``rollout_trace``) and decode counters (``policy.decode_stats``): what the TLT runtime logs per RL step, whichever
rollout backend served it. Pure: dicts in, a flat dict of floats out."""

from __future__ import annotations

from verl_tlt.metrics.decode_metrics import position_acceptance, source_metrics, strategy_acceptance
from verl_tlt.metrics.long_tail import long_tail_metrics
from verl_tlt.metrics.rollout_trace import rollout_summary


def rollout_metrics(
    records: list[dict | None], stats: list[dict], training_stopped_at: float | None = None
) -> dict[str, float]:
    """`tlt/tail/*`, `tlt/rollout/*` and `tlt/sd/*` for one rollout from every replica's record and counters.

    training_stopped_at: wall-clock time spot training of this rollout had stopped, if it ran; gives
    `tlt/spot/overrun_s`, from the last response to the stop's return (on an accelerator bounded by one optimizer
    step; on CPU by STOP_WAIT_S, a longer step ending in the background, `tlt/spot/stops_in_background`).
    """
    records = [r for r in records if r is not None]
    metrics: dict[str, float] = {}
    summary = rollout_summary(records)
    if summary:
        start = summary["start"]
        finishes = [t - start for r in records for t in r["finish_times"]]
        lengths = [n for r in records for n in r["response_tokens"]]
        metrics.update(long_tail_metrics(finishes, lengths))
        metrics["tlt/rollout/time_s"] = summary["last_finish"] - start
        if "engine_busy_s" in summary:
            # Against the rollout time, whether decoding bounds it (near 1 per replica) or the requests' arrival
            # and verl's agent loop do: only the decoding part is what speculation can shorten.
            metrics["tlt/rollout/engine_busy_s"] = summary["engine_busy_s"]
            metrics["tlt/rollout/last_submit_s"] = summary["last_submit"] - start
        metrics["tlt/tail/extension_s"] = summary["closed"] - summary["last_finish"]
        if "acceptance_length" in summary:
            metrics["tlt/sd/acceptance_length"] = summary["acceptance_length"]
        if training_stopped_at is not None:
            metrics["tlt/spot/overrun_s"] = max(0.0, training_stopped_at - summary["last_finish"])
        versions = [r["drafter_version"] for r in records if r.get("drafter_version") is not None]
        if versions:  # equal min and max: every replica sampled this rollout with the same drafter
            metrics["tlt/drafter/rollout_version_min"] = float(min(versions))
            metrics["tlt/drafter/rollout_version_max"] = float(max(versions))
    steps_sd = sum(s.get("steps_sd", 0) for s in stats)
    steps_all = steps_sd + sum(s.get("steps_plain", 0) for s in stats)
    tokens_sd = sum(s.get("tokens_sd", 0) for s in stats)
    tokens_all = tokens_sd + sum(s.get("tokens_plain", 0) for s in stats)
    metrics["tlt/sd/step_share"] = steps_sd / steps_all if steps_all else 0.0
    metrics["tlt/sd/token_share"] = tokens_sd / tokens_all if tokens_all else 0.0
    metrics["tlt/sd/drafter_failures"] = float(sum(s.get("drafter_failures", 0) for s in stats))
    mix: dict[str, int] = {}
    for s in stats:
        for counts in (s.get("strategy_histogram") or {}).values():
            for name, n in counts.items():
                mix[name] = mix.get(name, 0) + n
    for name, n in mix.items():
        metrics[f"tlt/sd/strategy/{metric_name(name)}"] = n / steps_all if steps_all else 0.0
    for name, length in strategy_acceptance(stats).items():
        metrics[f"tlt/sd/strategy_acceptance/{metric_name(name)}"] = length
    for bucket, length in position_acceptance(stats).items():
        metrics[f"tlt/sd/position_acceptance/{bucket}"] = length
    for name, value in source_metrics(stats).items():
        metrics[f"tlt/sd/source/{name}"] = value
    metrics.update(self_test_metrics([s["self_test"] for s in stats if s.get("self_test")]))
    metrics.update(policy_metrics([s["policy"] for s in stats if s.get("policy")]))
    return metrics


def policy_metrics(reports: list[dict]) -> dict[str, float]:
    """`tlt/sd/unpaid_plain_steps` (summed), `tlt/sd/cannot_pay_replicas`, and per arm `tlt/sd/predicted_rate/<arm>`
    and `tlt/sd/observed_rate/<arm>` (means over the replicas that have them) from the replicas' policy reports
    (`AdaptivePolicy.take_report`)."""
    if not reports:
        return {}
    metrics = {
        "tlt/sd/unpaid_plain_steps": float(sum(r.get("unpaid_plain_steps", 0) for r in reports)),
        "tlt/sd/cannot_pay_replicas": float(sum(r.get("cannot_pay") is not None for r in reports)),
    }
    by_arm: dict[str, list[dict]] = {}
    for report in reports:
        for arm, rates in (report.get("arms") or {}).items():
            by_arm.setdefault(arm, []).append(rates)
    for arm, entries in by_arm.items():
        for key in ("predicted", "observed"):
            metrics[f"tlt/sd/{key}_rate/{metric_name(arm)}"] = sum(e[key] for e in entries) / len(entries)
    return metrics


def self_test_metrics(counts: list[dict]) -> dict[str, float]:
    """`tlt/drafter/self_test_*` from the replicas' self-test counts (engine.drafts.self_test) since the last step:
    tests run and drafters refused (sums), the slowest replica's test seconds, the mean probe acceptance."""
    if not counts:
        return {}
    metrics = {
        "tlt/drafter/self_test_runs": float(sum(c["runs"] for c in counts)),
        "tlt/drafter/self_test_refused": float(sum(c["refused"] for c in counts)),
        "tlt/drafter/self_test_s": max(c["seconds"] for c in counts),
    }
    rates = [c["last_rate"] for c in counts if c.get("last_rate") is not None]
    if rates:
        metrics["tlt/drafter/self_test_accept_rate"] = sum(rates) / len(rates)
    return metrics


def metric_name(strategy: str) -> str:
    """A strategy's name as a metric key part: 'suffix:8_1_8' -> 'suffix/8_1_8' (some trackers refuse ':')."""
    return strategy.replace(":", "/")
