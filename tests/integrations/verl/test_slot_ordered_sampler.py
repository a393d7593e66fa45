"""The slot order: a batch's samples sorted by what they are (step, dataset index, sample number, output number,
prompt), never by when they finished or by their random uid."""

from __future__ import annotations

import random

import pytest

from verl_tlt.integrations.verl.same_samples import SAMPLER_NAME, SAMPLER_PATH
from verl_tlt.integrations.verl.slot_ordered_sampler import slot_key, slot_order


def sample(uid: str, index: int | None, session: int, output: int = 0, step: int = 3, prompt=(5, 6)):
    return f"{uid}_{session}_{output}", {"global_steps": step, "status": "success"}, index, list(prompt)


def test_the_key_ignores_the_random_uid_and_reads_session_and_output_numbers():
    assert slot_key(*sample("a1-b2", 7, 2, 1)) == slot_key(*sample("ffff-0000", 7, 2, 1)) == (3, 7, 2, 1, (5, 6))


def test_any_finishing_order_of_one_batch_gives_the_same_order():
    batch = [sample(f"uid{i}", index, session) for i, index in enumerate([4, 1, 9]) for session in range(3)]
    expected = sorted(batch, key=lambda s: (s[2], int(s[0].split("_")[1])))
    for seed in range(5):
        shuffled = random.Random(seed).sample(batch, len(batch))
        keys, tags, indices, prompts = zip(*shuffled, strict=True)
        order = slot_order(keys, tags, indices, prompts)
        assert [shuffled[i] for i in order] == expected


def test_prompts_break_ties_where_there_is_no_dataset_index():
    batch = [sample("x", None, 0, prompt=(9, 9)), sample("y", None, 0, prompt=(1, 2)), sample("z", 0, 0)]
    keys, tags, indices, prompts = zip(*batch, strict=True)
    assert slot_order(keys, tags, indices, prompts) == [1, 0, 2]


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="one tag, index and prompt per key"):
        slot_order(["u_0_0"], [{}], [1, 2], [[1]])


def test_verl_can_load_the_sampler_by_its_configured_path_and_name():
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.utils.import_utils import load_extern_object

    assert issubclass(load_extern_object(SAMPLER_PATH, SAMPLER_NAME), ReplayBuffer)


def test_an_async_trainer_mode_is_refused_with_the_fix():
    from verl_tlt.integrations.verl.slot_ordered_sampler import SlotOrderedReplayBuffer

    with pytest.raises(ValueError, match="trainer.v1.sampler.custom_sampler"):
        SlotOrderedReplayBuffer("async", None, None, "drop", {})
