"""The quickstart's figure: acceptance length per step (online drafter vs frozen) and step time per step
(baseline vs TLT, split into verl's phases). Needs matplotlib (`pip install verl-tlt[dev]`)."""

from __future__ import annotations

from pathlib import Path

from verl_tlt.quickstart.summary import STEP_PARTS, shows_toy_drift


def plot_comparison(runs: dict[str, list[dict]], out: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise RuntimeError(
            "The quickstart plot needs matplotlib: pip install 'verl-tlt[dev]' (scripts/setup_env.sh does)"
        ) from error

    fig, (accept_ax, time_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, label, style in (
        ("tlt", "engine: online drafter (TLT run)", "o-"),
        ("frozen", "engine: frozen drafter (frozen run)", "s--"),
    ):
        _plot_series(accept_ax, runs[name], "sd_acceptance_length", style, label)
    # The paired view: the TLT run's online and initial drafter scored on the same fresh samples.
    _plot_series(
        accept_ax, runs["tlt"], "drafter_eval_online_est_acceptance_length", "^-", "same samples: online (estimate)"
    )
    _plot_series(
        accept_ax, runs["tlt"], "drafter_eval_frozen_est_acceptance_length", "v--", "same samples: initial (estimate)"
    )
    if shows_toy_drift(runs):
        share_ax = accept_ax.twinx()
        for name, color in (("tlt", "gray"), ("frozen", "tab:orange")):
            _plot_series(share_ax, runs[name], "compact_share", ":", f"compact share, {name} run", color=color)
        share_ax.set_ylabel("share of compact-style responses (the drift)")
        share_ax.set_ylim(0, 1)
        share_ax.legend(loc="lower left", fontsize=7)
    accept_ax.set_xlabel("RL step")
    accept_ax.set_ylabel("acceptance length (tokens per verify step)")
    accept_ax.set_title("Drafter acceptance as the policy drifts")
    accept_ax.legend(loc="upper right", fontsize=7)

    width = 0.4
    for offset, name in ((-width / 2, "baseline"), (width / 2, "tlt")):
        rows = runs[name]
        steps = [r["step"] + offset for r in rows]
        bottom = [0.0] * len(rows)
        parts = [("rollout_s", "rollout (server-measured)")]
        parts += [(f"{p}_s", p) for p in STEP_PARTS if p != "gen"]
        parts += [("rest_s", "gen polling + other")]
        for key, label in parts:
            if key == "rest_s":
                values = [max(r["step_s"] - sum(r.get(k) or 0.0 for k, _ in parts[:-1]), 0.0) for r in rows]
            else:
                values = [r.get(key) or 0.0 for r in rows]
            time_ax.bar(
                steps,
                values,
                width,
                bottom=bottom,
                label=f"{label}" if name == "baseline" else None,
                color=_COLORS.get(key),
                hatch="//" if name == "tlt" else None,
                edgecolor="black",
                linewidth=0.3,
            )
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    time_ax.set_xlabel("RL step (plain bar: baseline, hatched: TLT)")
    time_ax.set_ylabel("seconds")
    time_ax.set_title("Step time breakdown")
    time_ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _plot_series(ax, rows: list[dict], key: str, style: str, label: str, color: str | None = None) -> None:
    points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    if points:
        ax.plot(*zip(*points, strict=True), style, label=label, color=color, markersize=4)


_COLORS = {
    "rollout_s": "tab:blue",
    "old_log_prob_s": "tab:orange",
    "adv_s": "tab:olive",
    "update_actor_s": "tab:red",
    "update_weights_s": "tab:purple",
    "rest_s": "lightgray",
}
