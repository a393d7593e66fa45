"""The simulator's picture of one RL step: a Gantt chart per run, one lane per rollout replica.

Each lane shows what the replica did over the step: prefill, plain decoding, speculative decoding, and the time it sat
drained while another replica still decoded (hatched where the run's drafter trains there, TLT's spot training);
then the training phases, which occupy every GPU. The runs share one time axis, so the baseline's long tail and what
TLT makes of it sit one above the other. Needs matplotlib (`pip install 'verl-tlt[dev]'`).
"""

from __future__ import annotations

from pathlib import Path

from verl_tlt.policy import PLAIN
from verl_tlt.sim.rl_step import RunResult
from verl_tlt.sim.rollout import PREFILL

COLORS = {
    PREFILL: "tab:purple",
    PLAIN: "tab:blue",
    "speculative": "tab:green",
    "idle": "lightgray",
    "training": "tab:orange",
}


def plot_step(runs: dict[str, RunResult], step: int, out: str | Path) -> Path:
    """Draw step `step` of every run (its timelines must have been kept) to `out` (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as error:
        raise RuntimeError("simulate --plot needs matplotlib: pip install 'verl-tlt[dev]'") from error
    lanes = max(len(run.steps[step].timelines) for run in runs.values())
    height = min(0.9, 8.0 / max(lanes, 1))
    fig, axes = plt.subplots(
        len(runs), 1, figsize=(12, 1.2 + len(runs) * (0.6 + lanes * height * 0.35)), sharex=True, squeeze=False
    )
    for ax, (name, run) in zip(axes[:, 0], runs.items(), strict=True):
        result = run.steps[step]
        if not result.timelines:
            raise ValueError(f"run {name!r} kept no timelines; simulate with keep_timelines=True")
        for lane, timeline in enumerate(result.timelines):
            bars: dict[str, list[tuple[float, float]]] = {}
            for record in timeline.steps:
                kind = record.arm if record.arm in (PREFILL, PLAIN) else "speculative"
                bars.setdefault(kind, []).append((record.start_s, record.seconds * record.count))
            for kind, spans in bars.items():
                ax.broken_barh(_merged(spans), (lane, height), color=COLORS[kind])
            idle = result.rollout_s - timeline.drained_s
            if idle > 0:
                hatch = "//" if result.harvested_gpu_s > 0 else None
                ax.broken_barh(
                    [(timeline.drained_s, idle)],
                    (lane, height),
                    facecolor=COLORS["idle"],
                    hatch=hatch,
                    edgecolor="gray",
                    linewidth=0,
                )
        ax.broken_barh(
            [(result.rollout_s, result.train_s + result.extra_s)],
            (0, len(result.timelines)),
            color=COLORS["training"],
            alpha=0.6,
        )
        ax.set_yticks([])
        ax.set_ylabel(f"{name}\n{len(result.timelines)} replicas", fontsize=8)
        ax.set_title(f"{name}: rollout {result.rollout_s:.0f} s, step {result.step_s:.0f} s", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds into the RL step")
    handles = [Patch(color=color, label=kind) for kind, color in COLORS.items()]
    handles.append(Patch(facecolor=COLORS["idle"], hatch="//", edgecolor="gray", label="idle, drafter training"))
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=3)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Adjacent spans as one (thousands of steps would otherwise be thousands of rectangles)."""
    merged: list[list[float]] = []
    for start, width in sorted(spans):
        if merged and start <= merged[-1][0] + merged[-1][1] + 1e-9:
            merged[-1][1] = max(merged[-1][1], start + width - merged[-1][0])
        else:
            merged.append([start, width])
    return [(start, width) for start, width in merged]
