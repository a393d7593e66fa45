"""Slot seeds: a function of (rollout seed, slot, prompt) only, distinct across slots."""

from __future__ import annotations

from verl_tlt.integrations.verl.request_seeds import rollout_seed, slot_name, slot_seed


def test_slots_are_named_by_step_dataset_index_and_group_member():
    assert slot_name(3, 12, 1) == "3/12/s1"  # verl's V1 trainers: session ids within the group
    assert slot_name(3, 12, None, priority=40) == "3/12/p40"  # the classic agent loop: batch positions
    assert slot_name(3, None, 1) is None


def test_slot_seeds_are_stable_distinct_and_63_bit():
    slots = [slot_name(step, index, member) for step in range(3) for index in range(50) for member in range(4)]
    seeds = {slot_seed(0, slot, [5, 6]) for slot in slots}
    assert len(seeds) == 600 and all(0 <= seed < 2**63 for seed in seeds)
    assert slot_seed(0, "1/7/s1", [5, 6]) == slot_seed(0, "1/7/s1", [5, 6])
    assert slot_seed(1, "1/7/s1", [5, 6]) != slot_seed(0, "1/7/s1", [5, 6])
    assert slot_seed(0, "1/7/s1", [5, 7]) != slot_seed(0, "1/7/s1", [5, 6])  # the prompt is part of the seed


def test_the_rollout_seed_reads_mappings_and_attribute_configs_and_treats_null_as_zero():
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from verl.workers.config import RolloutConfig

    assert rollout_seed(OmegaConf.create({"seed": 7})) == 7
    assert rollout_seed({"seed": None}) == 0 and rollout_seed({}) == 0
    assert rollout_seed(SimpleNamespace(seed=3)) == 3
    assert rollout_seed(RolloutConfig(name="torch", seed=5)) == 5
