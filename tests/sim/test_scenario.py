"""Scenarios: presets load, every assumption must be stated, unknown keys are refused by name, overrides apply."""

from __future__ import annotations

import pytest

from verl_tlt.sim.scenario import from_dict, load, preset_names


def minimal(**changes) -> dict:
    """A CPU scenario whose answers are known: one replica, 1 s plain steps, lengths from a list."""
    values = {
        "cluster": {"nodes": 1, "gpus_per_node": 1, "rollout_tp": 1},
        "model": "toy",
        "batch": {"prompts": 2, "group_size": 2, "prompt_tokens": 4},
        "lengths": {"median_tokens": 3, "prompt_sigma": 0.0, "sample_sigma": 0.0, "max_tokens": 10},
        "decode": {"kind": "linear", "fixed_s": 1.0},
        "acceptance": {"kind": "chain", "eagle": 1.0},
        "drafter": {"start": 1.0, "ceiling": 1.0, "floor": 0.0, "drift_per_step": 0.0, "recover_gpu_s": 1.0},
        "training": {"mfu": 0.5, "weight_sync_s": 2.0, "other_s": 3.0},
        "steps": 2,
    }
    for key, value in changes.items():
        values[key] = value
    return values


def test_every_preset_loads_and_states_its_sources():
    assert {"qwen2.5-7b-h100-1node", "qwen2.5-32b-h100-4node", "quickstart-cpu"} <= set(preset_names())
    for name in preset_names():
        scenario, _ = load(name)
        assert scenario.description and scenario.sources, name
        scenario.speculative_cost()
        scenario.acceptance_model()


def test_dotted_overrides_change_a_preset():
    scenario, _ = load("qwen2.5-7b-h100-1node", {"cluster.nodes": 4, "tlt.threshold": 16, "runs": ["baseline"]})
    assert scenario.cluster.replicas == 8 and scenario.tlt.threshold == 16 and scenario.runs == ("baseline",)


def test_a_missing_assumption_is_named():
    values = minimal()
    del values["training"]["mfu"]
    with pytest.raises(ValueError, match="training: missing mfu"):
        from_dict(values)


def test_an_unknown_key_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match="cluster: unknown key.*gpus_per_nod.*known: accelerator"):
        from_dict(minimal(cluster={"nodes": 1, "gpus_per_nod": 1, "rollout_tp": 1}))


def test_an_unknown_run_and_a_missing_baseline_are_refused():
    with pytest.raises(ValueError, match="unknown run 'fast'"):
        from_dict(minimal(runs=["baseline", "fast"]))
    with pytest.raises(ValueError, match="must include 'baseline'"):
        from_dict(minimal(runs=["tlt"]))


def test_gpus_must_split_into_replicas():
    with pytest.raises(ValueError, match="tp=3"):
        from_dict(minimal(cluster={"nodes": 1, "gpus_per_node": 8, "rollout_tp": 3}))


def test_a_preset_that_does_not_exist_lists_the_presets():
    with pytest.raises(ValueError, match="presets: .*qwen2.5-7b-h100-1node"):
        load("qwen3-1000b")


def test_decode_and_acceptance_kinds_are_checked():
    with pytest.raises(ValueError, match="decode.kind"):
        from_dict(minimal(decode={"kind": "magic"})).speculative_cost()
    with pytest.raises(ValueError, match="acceptance.lengths keys"):
        from_dict(minimal(acceptance={"kind": "table", "lengths": {"eight": 3.0}})).acceptance_model()
