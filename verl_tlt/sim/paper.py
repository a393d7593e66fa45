"""The TLT paper's cluster-scale table, simulated: each cell of its scaling table (Qwen2.5-7B on 1/2/4/8 H100 nodes,
Qwen2.5-32B on 4/8) from the presets, the ablations beside TLT, and a projection of this project's additions at 8
nodes, which the paper does not measure.

Paper figures: TLT's end-to-end speedup over verl (Table 3 of arXiv 2511.16665, as quoted in its scaling table).
Every assumption is in the presets (`presets/*.yaml`, their `sources`); a cell is a preset with `cluster.nodes` set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl_tlt.sim.rl_step import RunResult, simulate_scenario, speedups
from verl_tlt.sim.scenario import load


@dataclass(frozen=True)
class PaperCell:
    model: str
    preset: str
    nodes: int
    paper_speedup: float


PAPER_CELLS = (
    PaperCell("Qwen2.5-7B", "qwen2.5-7b-h100-1node", 1, 1.21),
    PaperCell("Qwen2.5-7B", "qwen2.5-7b-h100-1node", 2, 1.45),
    PaperCell("Qwen2.5-7B", "qwen2.5-7b-h100-1node", 4, 1.62),
    PaperCell("Qwen2.5-7B", "qwen2.5-7b-h100-1node", 8, 1.76),
    PaperCell("Qwen2.5-32B", "qwen2.5-32b-h100-4node", 4, 1.83),
    PaperCell("Qwen2.5-32B", "qwen2.5-32b-h100-4node", 8, 2.12),
)

# The projection: Qwen2.5-7B on 8 nodes with what verl-tlt adds, each an assumption stated here.
PROJECTION_PRESET, PROJECTION_NODES = "qwen2.5-7b-h100-1node", 8
PROJECTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "TLT (as in the paper)": ("tlt", {}),
    "+ group drafts (suffix:8_1_8 arm; siblings agree little: per-position acceptance 0.5)": (
        "group_drafts",
        {"acceptance.suffix": 0.5, "tlt.group_strategies": ["suffix:8_1_8"]},
    ),
    "+ group drafts (siblings agree more: per-position acceptance 0.7)": (
        "group_drafts",
        {"acceptance.suffix": 0.7, "tlt.group_strategies": ["suffix:8_1_8"]},
    ),
    "threshold 16 instead of 32": ("tlt", {"tlt.threshold": 16}),
    "threshold 64 instead of 32": ("tlt", {"tlt.threshold": 64}),
    "+ partial rollouts (8k tokens per response per step)": ("partial", {"tlt.partial_budget_tokens": 8192}),
    "partial rollouts alone, no SD (8k tokens per response per step)": (
        "partial_plain",
        {"tlt.partial_budget_tokens": 8192},
    ),
}


@dataclass
class CellResult:
    cell: PaperCell
    runs: dict[str, RunResult]

    @property
    def speedups(self) -> dict[str, dict[str, float]]:
        return speedups(self.runs)

    @property
    def simulated(self) -> float:
        return self.speedups["tlt"]["e2e"]

    @property
    def error(self) -> float:
        return self.simulated / self.cell.paper_speedup - 1.0

    @property
    def rollout_share(self) -> float:
        """The baseline's share of step time in rollout."""
        base = self.runs["baseline"]
        return base.rollout_s / base.time_s


def simulate_paper(steps: int | None = None, progress: Callable[[str], None] | None = None) -> list[CellResult]:
    results = []
    for cell in PAPER_CELLS:
        overrides: dict[str, Any] = {"cluster.nodes": cell.nodes}
        if steps is not None:
            overrides["steps"] = steps
        scenario, base_dir = load(cell.preset, overrides)
        results.append(CellResult(cell, simulate_scenario(scenario, base_dir)))
        if progress is not None:
            progress(f"{cell.model} on {cell.nodes} node(s)")
    return results


def simulate_projection(
    steps: int | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, dict[str, float]]:
    """Each projection's e2e and rollout speedup over the same baseline (7B, 8 nodes)."""
    rows = {}
    for label, (run, overrides) in PROJECTIONS.items():
        values: dict[str, Any] = {"cluster.nodes": PROJECTION_NODES, "runs": ["baseline", run], **overrides}
        if steps is not None:
            values["steps"] = steps
        scenario, base_dir = load(PROJECTION_PRESET, values)
        rows[label] = speedups(simulate_scenario(scenario, base_dir))[run]
        if progress is not None:
            progress(label)
    return rows
