"""RL steps on a simulated cluster, on cases whose answers are known."""

from __future__ import annotations

import pytest

from tests.sim.test_scenario import minimal
from verl_tlt.sim.rl_step import simulate_run, simulate_scenario, speedups, training_seconds
from verl_tlt.sim.scenario import from_dict, load


def test_a_plain_step_is_prefill_then_one_step_per_token_then_the_fixed_phases():
    scenario = from_dict(minimal())
    run = simulate_run(scenario, "baseline")
    step = run.steps[0]
    # 4 requests of 3 tokens: a 1 s prefill gives each its first token, two 1 s decode steps the rest.
    assert step.rollout_s == pytest.approx(3.0) and step.train_s == pytest.approx(5.0)
    assert run.time_s == pytest.approx(2 * 8.0) and step.speculative_share == 0.0 and step.acceptance == 1.0


def test_a_perfect_drafter_halves_the_decode_steps_and_every_run_sees_the_same_lengths():
    values = minimal(
        lengths={"median_tokens": 9, "prompt_sigma": 0.0, "sample_sigma": 0.0, "max_tokens": 10},
        tlt={"threshold": 32, "strategies": ["2_1_2"]},
        runs=["baseline", "fixed"],
    )
    runs = simulate_scenario(from_dict(values))
    # Baseline: prefill + 8 decode steps. A chain of 2 always accepted commits 3 tokens a step: prefill + 3 steps
    # (priced as 1 s + nothing for the drafter, whose fraction is 0 here).
    assert runs["baseline"].steps[0].rollout_s == pytest.approx(9.0)
    assert runs["fixed"].steps[0].rollout_s == pytest.approx(4.0)
    assert runs["fixed"].steps[0].acceptance == pytest.approx(8 / 3)  # 3 + 3 + the last 2 a row had left
    assert runs["baseline"].steps[1].lengths == runs["fixed"].steps[1].lengths
    assert speedups(runs)["fixed"]["rollout"] == pytest.approx(9.0 / 4.0)


def test_idle_replicas_are_harvested_only_by_runs_that_train_the_drafter():
    values = minimal(
        cluster={"nodes": 1, "gpus_per_node": 2, "rollout_tp": 1},
        lengths={"median_tokens": 5, "prompt_sigma": 0.0, "sample_sigma": 1.5, "max_tokens": 50},
        runs=["baseline", "tlt", "frozen"],
    )
    runs = simulate_scenario(from_dict(values))
    assert runs["tlt"].steps[0].idle_gpu_s > 0
    assert runs["tlt"].steps[0].harvested_gpu_s == runs["tlt"].steps[0].idle_gpu_s
    assert runs["frozen"].steps[0].harvested_gpu_s == 0 and runs["baseline"].steps[0].harvested_gpu_s == 0


def test_a_drafter_that_drifts_accepts_less_unless_spot_training_pulls_it_back():
    values = minimal(
        cluster={"nodes": 1, "gpus_per_node": 2, "rollout_tp": 1},
        batch={"prompts": 4, "group_size": 2, "prompt_tokens": 4},
        lengths={"median_tokens": 20, "prompt_sigma": 1.0, "sample_sigma": 0.0, "max_tokens": 200},
        acceptance={"kind": "chain", "eagle": 0.8},
        drafter={"start": 1.0, "ceiling": 1.0, "floor": 0.0, "drift_per_step": 0.5, "recover_gpu_s": 0.1},
        tlt={"threshold": 32, "strategies": ["4_1_4"]},
        runs=["baseline", "tlt", "frozen", "no_spot"],
        steps=4,
    )
    runs = simulate_scenario(from_dict(values))
    frozen = [step.quality for step in runs["frozen"].steps]
    assert frozen == pytest.approx([1.0, 0.5, 0.25, 0.125])
    assert runs["tlt"].steps[-1].quality > 0.45 and runs["tlt"].rollout_s < runs["frozen"].rollout_s
    # no_spot trains as much after the rollout: the drafter keeps up, the step pays for it.
    assert runs["no_spot"].steps[-1].extra_s == pytest.approx(0.1 / 2)


def test_partial_rollouts_cap_each_steps_decoding_and_carry_the_rest():
    values = minimal(
        lengths={"median_tokens": 10, "prompt_sigma": 0.0, "sample_sigma": 0.0, "max_tokens": 10},
        tlt={"partial_budget_tokens": 4},
        runs=["baseline", "partial_plain"],
        steps=3,
    )
    runs = simulate_scenario(from_dict(values))
    # Step 0 decodes 4 tokens of each new response; step 1 carries 6 left (4 decoded) plus 4 of the new ones.
    assert runs["partial_plain"].steps[0].rollout_s == pytest.approx(4.0)
    assert runs["partial_plain"].steps[1].rollout_s == pytest.approx(4.0)
    assert runs["baseline"].steps[0].rollout_s == pytest.approx(10.0)


def test_training_flops_follow_the_formula():
    scenario, _ = load("qwen2.5-7b-h100-1node", {"training.weight_sync_s": 0.0, "training.other_s": 0.0})
    from verl_tlt.sim.roofline import ACCELERATORS, MODELS

    shape, gpu = MODELS["qwen2.5-7b"], ACCELERATORS["h100-sxm"]
    n = 1000 + 300
    flops = 2 * shape.matmul_params * n + 2 * shape.layers * shape.hidden * n * n
    expected = (2 + 3) * flops / (8 * gpu.peak_flops * scenario.training.mfu)
    assert training_seconds(scenario, [1000], [300]) == pytest.approx(expected)


def test_tlt_beats_the_baseline_on_the_7b_preset_and_the_ablations_fall_behind_it():
    scenario, _ = load("qwen2.5-7b-h100-1node", {"cluster.nodes": 2, "steps": 3})
    ratios = speedups(simulate_scenario(scenario))
    assert ratios["tlt"]["e2e"] > 1.2
    for ablation in ("fixed", "sd_always", "frozen", "no_spot"):
        assert ratios[ablation]["e2e"] < ratios["tlt"]["e2e"], ablation
