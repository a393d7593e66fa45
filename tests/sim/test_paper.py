"""The paper presets: their fitted constants reproduce the paper figures they were fitted to, and the paper table
runs end to end."""

from __future__ import annotations

import pytest

from verl_tlt.sim.paper import PAPER_CELLS, simulate_paper
from verl_tlt.sim.report import paper_lines
from verl_tlt.sim.scenario import load


@pytest.mark.parametrize("preset", ["qwen2.5-7b-h100-1node", "qwen2.5-32b-h100-4node"])
def test_the_decode_constants_reproduce_the_papers_batch_1_rates_they_were_fitted_to(preset):
    # Table 2 (H100, Qwen2.5-7B, batch 1, TP 1): 164.65 tok/s plain, 430.24 tok/s with SD; 6.53 accepted (Table 6).
    scenario, _ = load(preset, {"model": "qwen2.5-7b", "cluster.rollout_tp": 1})
    cost = scenario.speculative_cost()
    assert 1 / cost.plain_seconds(1, 300) == pytest.approx(164.65, rel=0.01)
    sd_step = cost.speculative_seconds(1, 8, 48, drafts_with_model=True, kv_tokens=300, top_k=4)
    assert 6.53 / sd_step == pytest.approx(430.24, rel=0.01)


def test_the_drafter_quality_matches_table_6_at_the_batch_1_strategy():
    from verl_tlt.spec.strategy import SpecStrategy

    scenario, _ = load("qwen2.5-7b-h100-1node")
    acceptance = scenario.acceptance_model().scaled(scenario.drafter.ceiling)
    assert acceptance.expected(SpecStrategy.parse("8_4_48")) == pytest.approx(6.53, abs=0.01)


@pytest.mark.slow
def test_the_paper_table_runs_and_prints_every_cell():
    cells = simulate_paper(steps=1)
    assert [(c.cell.model, c.cell.nodes) for c in cells] == [(c.model, c.nodes) for c in PAPER_CELLS]
    assert all(c.simulated > 1.0 for c in cells)
    lines = paper_lines(cells, None)
    assert sum(line.startswith("Qwen2.5-") for line in lines) == len(PAPER_CELLS)
