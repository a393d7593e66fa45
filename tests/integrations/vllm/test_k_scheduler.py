"""TLT's per-step K lookup inside vLLM's scheduler (pure: a fake scheduler, no vLLM needed)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from verl_tlt.config import SpeculativeConfig
from verl_tlt.integrations.vllm.k_scheduler import POLICY_ENV, PolicyLookup, policy_env_value, policy_from_env
from verl_tlt.integrations.vllm.speculative_config import DEFAULT_VLLM_STRATEGIES, chain_depths, policy_schedule


def _dense(schedule: list[list[int]], max_batch: int) -> list[int]:
    """vLLM's dense batch-size -> K table for `schedule` (index 0 unused), as build_dynamic_sd_schedule_lookup makes."""
    table = [0] * (max_batch + 1)
    for first, last, k in schedule:
        for size in range(first, min(last, max_batch) + 1):
            table[size] = k
    return table


@pytest.fixture
def lookup(monkeypatch):
    speculative = SpeculativeConfig(threshold=4, strategies=DEFAULT_VLLM_STRATEGIES)
    monkeypatch.setenv(POLICY_ENV, policy_env_value(speculative, chain_depths(speculative)))
    scheduler = SimpleNamespace(running=[SimpleNamespace(num_output_tokens=3) for _ in range(2)])
    return PolicyLookup(policy_from_env(), scheduler, _dense(policy_schedule(speculative, 16), 16))


def test_indexing_asks_the_policy_once_per_step_for_a_k_vllm_prepared(lookup):
    picked = [lookup[2] for _ in range(50)]
    # Every K the policy picks (plain included) is in vLLM's table, so vLLM captured a graph for it.
    assert set(picked) <= set(lookup) and set(picked) - {0}
    assert len(lookup.chosen) == 50 and {batch for _, batch in lookup.chosen} == {2}  # two running decodes


def test_the_lookup_is_a_full_sequence_whose_inspection_never_makes_a_choice(lookup):
    assert len(lookup) == 17
    assert list(lookup) == lookup.table and lookup[1:5] == lookup.table[1:5]
    assert 0 in lookup and 8 in lookup and 7 not in lookup
    assert lookup.chosen == []  # length, iteration, slices and `in` read vLLM's table only
    with pytest.raises(IndexError, match="outside vLLM's schedule"):
        lookup[17]


def test_no_decode_request_means_plain(lookup):
    lookup.scheduler.running = [SimpleNamespace(num_output_tokens=0)]  # a prefill only
    assert lookup[1] == 0 and lookup.chosen == [(None, 0)]


def test_the_policy_env_carries_the_chains_vllm_drafts():
    value = json.loads(policy_env_value(SpeculativeConfig(), (6, 2)))
    assert value["strategies"] == ["6_1_6", "2_1_2"]
