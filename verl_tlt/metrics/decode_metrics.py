"""Metrics over several engines' decode counters (policy.decode_stats): acceptance length per strategy and per draft
source, and decode milliseconds per token by batch-size group, as the rollout metrics, the quickstart and the
benchmarks report them."""

from __future__ import annotations

from collections import Counter

from verl_tlt.policy.gate import PLAIN
from verl_tlt.spec.strategy import SpecStrategy


def strategy_acceptance(stats: list[dict]) -> dict[str, float]:
    """Acceptance length per strategy over several engines' `DecodeStats.as_dict()`: committed tokens / rows."""
    return _tokens_per_row(stats, "strategy")


def position_acceptance(stats: list[dict]) -> dict[str, float]:
    """Acceptance length per response-position bucket over several engines' `DecodeStats.as_dict()`: tokens committed
    per verified row by rows that stood in that bucket of their response."""
    return _tokens_per_row(stats, "position")


def _tokens_per_row(stats: list[dict], by: str) -> dict[str, float]:
    """sd_tokens_by_<by> / sd_rows_by_<by> summed over engines, per key."""
    rows: Counter = Counter()
    tokens: Counter = Counter()
    for entry in stats:
        rows.update(entry.get(f"sd_rows_by_{by}") or {})
        tokens.update(entry.get(f"sd_tokens_by_{by}") or {})
    return {key: tokens[key] / count for key, count in rows.items() if count}


def source_metrics(stats: list[dict]) -> dict[str, float]:
    """Per draft source over several engines' `DecodeStats.as_dict()`, keyed '<source>/<name>':

    draft_share (of all draft tokens verified), accept_rate (its draft tokens accepted), tokens_saved (accepted draft
    tokens: target forwards saved) for the sources that draft ('eagle', 'suffix'; a mixed step counts each level under
    the source that drafted it), and acceptance_length per arm source ('eagle', 'suffix', 'mixed': committed tokens per
    verified row of the strategies with that source)."""
    drafted: Counter = Counter()
    accepted: Counter = Counter()
    for entry in stats:
        drafted.update(entry.get("drafted_by_source") or {})
        accepted.update(entry.get("accepted_by_source") or {})
    total = sum(drafted.values())
    metrics = {}
    for source, count in sorted(drafted.items()):
        metrics[f"{source}/draft_share"] = count / total if total else 0.0
        metrics[f"{source}/accept_rate"] = accepted[source] / count if count else 0.0
        metrics[f"{source}/tokens_saved"] = float(accepted[source])
    rows: Counter = Counter()
    tokens: Counter = Counter()
    for entry in stats:
        for name, count in (entry.get("sd_rows_by_strategy") or {}).items():
            source = SpecStrategy.parse(name).source
            rows[source] += count
            tokens[source] += (entry.get("sd_tokens_by_strategy") or {}).get(name, 0)
    for source, count in sorted(rows.items()):
        if count:
            metrics[f"{source}/acceptance_length"] = tokens[source] / count
    return metrics


def overall_acceptance(stats: dict) -> float:
    """Acceptance length over every strategy of one `DecodeStats.as_dict()`: committed tokens / verified rows (nan
    when nothing was verified)."""
    rows = sum(stats["sd_rows_by_strategy"].values())
    return sum(stats["sd_tokens_by_strategy"].values()) / rows if rows else float("nan")


def ms_per_token_by_batch(records: list[dict]) -> dict[str, dict[str, float]]:
    """Decode milliseconds per committed token by batch group, plain and speculative (every strategy pooled), summed
    over `DecodeCosts.take()` results (e.g. every rollout of a run); groups ascending, arms without tokens left out."""
    totals: dict[int, dict[str, list[float]]] = {}
    for costs in records:
        for group, arms in costs.items():
            for arm, (tokens, seconds, _steps) in arms.items():
                kind = PLAIN if arm == PLAIN else "sd"
                entry = totals.setdefault(int(group), {}).setdefault(kind, [0, 0.0])
                entry[0] += tokens
                entry[1] += seconds
    return {
        str(group): {kind: 1000 * seconds / tokens for kind, (tokens, seconds) in sorted(kinds.items()) if tokens}
        for group, kinds in sorted(totals.items())
    }
