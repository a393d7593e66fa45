"""Slot-named requests and their seeds: a function of (rollout seed, rollout count, slot, prompt) only."""

from __future__ import annotations

from verl_tlt.integrations.verl.request_seeds import slot_request_id, slot_seed


def test_slots_are_named_by_dataset_index_and_group_member():
    assert slot_request_id(12, 3) == "tlt-slot-12-s3"  # verl's V1 trainers: session ids within the group
    assert slot_request_id(12, None, priority=40) == "tlt-slot-12-p40"  # the classic agent loop: batch positions
    assert slot_request_id(None, 3) is None


def test_slot_named_requests_get_stable_distinct_64_bit_seeds():
    names = [slot_request_id(index, member) for index in range(50) for member in range(4)]
    seeds = {slot_seed(0, rollout, name, [5, 6]) for rollout in range(3) for name in names}
    assert len(seeds) == 600 and all(0 <= seed < 2**64 for seed in seeds)
    name = slot_request_id(7, 1)
    assert slot_seed(0, 1, name, [5, 6]) == slot_seed(0, 1, name, [5, 6])
    assert slot_seed(1, 1, name, [5, 6]) != slot_seed(0, 1, name, [5, 6])
    assert slot_seed(0, 1, name, [5, 7]) != slot_seed(0, 1, name, [5, 6])  # the prompt is part of the seed


def test_other_request_ids_get_no_seed():
    assert slot_seed(0, 0, "3f2a9c0d4e5b6a7f8091a2b3c4d5e6f7", [1]) is None
