"""The speculative_config TLT gives vLLM: chains only, K gated by the threshold (pure, no vLLM needed)."""

from __future__ import annotations

import pytest

from verl_tlt.config import SpeculativeConfig
from verl_tlt.integrations.vllm.speculative_config import (
    DEFAULT_VLLM_STRATEGIES,
    build_speculative_config,
    chain_depths,
    static_schedule,
)


def test_the_default_strategies_become_chains_of_the_same_depths():
    assert chain_depths(SpeculativeConfig()) == (8, 6, 4, 2)
    assert DEFAULT_VLLM_STRATEGIES == ("8_1_8", "6_1_6", "4_1_4", "2_1_2")


def test_explicit_chains_are_kept_deepest_first():
    assert chain_depths(SpeculativeConfig(strategies=("2_1_2", "5_1_5"))) == (5, 2)


def test_explicit_trees_are_refused_with_the_chains_that_fix_it():
    with pytest.raises(ValueError) as excinfo:
        chain_depths(SpeculativeConfig(strategies=("6_4_8", "3_1_3")))
    message = str(excinfo.value)
    assert "['6_4_8']" in message and """tlt.speculative.strategies='["6_1_6","3_1_3"]'""" in message
    assert "actor_rollout_ref.rollout.name=torch" in message


def test_the_schedule_speculates_up_to_the_threshold_inclusive_and_decodes_plainly_above():
    speculative = SpeculativeConfig(threshold=32)
    assert static_schedule(speculative, max_num_seqs=256, k=8) == [[1, 32, 8], [33, 256, 0]]
    assert static_schedule(speculative, max_num_seqs=16, k=8) == [[1, 16, 8]]  # never above the threshold


def test_the_engine_argument_names_the_drafter_and_the_deepest_k():
    config = build_speculative_config(SpeculativeConfig(threshold=4), "/d", max_num_seqs=64, method="eagle")
    assert config == {
        "method": "eagle",
        "model": "/d",
        "num_speculative_tokens": 8,
        "num_speculative_tokens_per_batch_size": [[1, 4, 8], [5, 64, 0]],
    }
    assert "num_speculative_tokens_per_batch_size" not in build_speculative_config(
        SpeculativeConfig(), "/d", 64, dynamic=False, method="eagle"
    )


def test_the_policy_schedule_lists_every_chain_k_and_plain_so_vllm_prepares_each():
    from verl_tlt.integrations.vllm.speculative_config import policy_schedule

    speculative = SpeculativeConfig(threshold=32)
    schedule = policy_schedule(speculative, max_num_seqs=256)
    assert schedule == [[1, 1, 8], [2, 2, 6], [3, 3, 4], [4, 32, 2], [33, 256, 0]]
    assert {k for _, _, k in schedule} == {*chain_depths(speculative), 0}


def test_the_policy_schedule_stays_valid_for_vllm_when_chains_outnumber_the_speculating_batch_sizes():
    from verl_tlt.integrations.vllm.speculative_config import policy_schedule

    schedule = policy_schedule(SpeculativeConfig(threshold=2), max_num_seqs=3)
    assert schedule == [[1, 1, 8], [2, 2, 6], [3, 3, 4], [4, 4, 2], [5, 5, 0]]
    # vLLM's rules (validate_and_normalize_dynamic_sd_schedule): starts at 1, positive, sorted, no overlap.
    assert schedule[0][0] == 1
    assert all(first <= last for first, last, _ in schedule)
    assert all(prev[1] < nxt[0] for prev, nxt in zip(schedule, schedule[1:], strict=False))


def test_the_engine_argument_of_an_adaptive_engine_carries_the_policy_schedule():
    speculative = SpeculativeConfig(strategies=("4_1_4", "2_1_2"), threshold=4)
    config = build_speculative_config(speculative, "/d", 8, adaptive=True, method="eagle")
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 4, 2], [5, 8, 0]]


def test_the_method_is_the_exports_own(tmp_path):
    import json

    from verl_tlt.integrations.vllm.speculative_config import drafter_method

    (tmp_path / "config.json").write_text(json.dumps({"verl_tlt": {"format": "eagle3"}}))
    assert build_speculative_config(SpeculativeConfig(), str(tmp_path), 8)["method"] == "eagle3"
    (tmp_path / "config.json").write_text(json.dumps({"verl_tlt": {"format": "eagle1"}}))
    assert drafter_method(str(tmp_path)) == "eagle"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    assert drafter_method(str(tmp_path)) == "eagle3"  # another trainer's EAGLE-3 checkpoint
