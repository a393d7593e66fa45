"""Slot seeds: a function of (rollout seed, slot, prompt) only, distinct across slots."""

from __future__ import annotations

from verl_tlt.request_seeds import rollout_seed, slot_name, slot_seed


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


def test_siblings_share_a_group_name_and_other_prompts_or_steps_do_not():
    from verl_tlt.request_seeds import group_name

    assert group_name(3, 7) == group_name(3.0, 7) == "3/7"
    assert len({group_name(3, 7), group_name(4, 7), group_name(3, 8)}) == 3
    assert group_name(3, None) is None


class _RecordingServerManager:
    def __init__(self):
        self.calls = []

    async def generate(self, **kwargs):
        self.calls.append(kwargs)
        return "output"


def test_group_drafts_send_the_group_and_route_siblings_by_it():
    import asyncio

    import verl.experimental.agent_loop  # noqa: F401 - verl first, as in a run: it loads the plugin

    from verl_tlt.integrations.verl.slot_seeded_agent_loop import _SeededRequests
    from verl_tlt.request_seeds import GROUP_KWARG

    manager = _RecordingServerManager()
    for member, group in (("s0", "5/2"), ("s1", "5/2"), ("s0", None)):
        requests = _SeededRequests(manager, 0, f"5/2/{member}", group)
        asyncio.run(requests.generate(request_id=f"uuid-{member}", prompt_ids=[1, 2], sampling_params={}))
    first, second, ungrouped = manager.calls
    assert first[GROUP_KWARG] == second[GROUP_KWARG] == "5/2"
    assert first["request_id"] == second["request_id"]  # the load balancer keeps one id on one replica
    assert first["sampling_params"]["seed"] != second["sampling_params"]["seed"]  # each sample keeps its own seed
    assert GROUP_KWARG not in ungrouped and ungrouped["request_id"] == "uuid-s0"


def test_group_drafts_are_asked_for_only_with_tlt_on_the_torch_rollout():
    import verl.experimental.agent_loop  # noqa: F401
    from omegaconf import OmegaConf

    from verl_tlt.integrations.verl.slot_seeded_agent_loop import _group_drafts_on

    def config(enabled, group_drafts, rollout):
        return OmegaConf.create(
            {
                "tlt": {"enabled": enabled, "speculative": {"group_drafts": group_drafts}},
                "actor_rollout_ref": {"rollout": {"name": rollout}},
            }
        )

    assert _group_drafts_on(config(True, True, "torch"))
    assert not _group_drafts_on(config(False, True, "torch"))
    assert not _group_drafts_on(config(True, False, "torch"))
    assert not _group_drafts_on(config(True, True, "vllm"))
    assert not _group_drafts_on(OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "torch"}}}))
