"""The torch engine with the speculation policy attached: speculation only where the gate allows it, output equal
to plain decoding, and every decode step counted under its strategy."""

from __future__ import annotations

import pytest

from tests.engine.drafters import HFModelDrafter
from verl_tlt.config import SpeculativeConfig
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.policy import AdaptivePolicy


def test_engine_with_policy_speculates_only_in_the_tail_and_stays_exact(varied_qwen2):
    path, hf_model = varied_qwen2
    prompts = [[5 + i, 6 + i, 7 + i] for i in range(12)]
    lengths = [4, 4, 4, 4, 4, 4, 4, 4, 30, 30, 40, 40]  # a long tail: 8 short requests, 4 long ones
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    plain = RolloutEngine.from_pretrained(str(path), max_num_seqs=16).generate(prompts, params)
    policy = AdaptivePolicy(SpeculativeConfig(threshold=4, buckets=(1, 2, 4), plain_arm_min_batch=4, min_dwell_steps=1))
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=16, drafter=HFModelDrafter(hf_model), policy=policy)
    outputs = engine.generate(prompts, params)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]
    stats = engine.stats.as_dict()
    assert stats["steps_sd"] > 0 and stats["steps_plain"] > 0
    assert set(stats["strategy_histogram"]["above_threshold"]) == {"plain"}  # 12 running > threshold 4
    assert 0 < stats["sd_token_share"] < 1
    assert sum(arm["plays"] for arm in policy.state()["buckets"][4].values()) > 0


def test_engine_counts_every_speculative_token_under_its_strategy(varied_qwen2):
    path, hf_model = varied_qwen2
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=4, drafter=HFModelDrafter(hf_model))
    params = SamplingParams(temperature=0, max_tokens=21, ignore_eos=True)
    engine.generate([[5, 6, 7], [8, 9]], params, strategy="4_1_4")
    stats = engine.stats.as_dict()
    assert stats["sd_tokens_by_strategy"] == {"4_1_4": stats["tokens_sd"]}
    # A perfect drafter: every verified row commits 5 tokens, except where max_tokens cuts the last draft (20 = 4 x 5).
    assert engine.stats.acceptance_by_strategy()["4_1_4"] == pytest.approx(5.0)
    # The same steps by batch-size group: a batch of 2 until the shorter request finishes (all 21 tokens at batch 2).
    costs = engine.decode_costs.take()
    assert set(costs) == {"2"} and set(costs["2"]) == {"4_1_4"}
    tokens, seconds, steps = costs["2"]["4_1_4"]
    assert tokens == stats["tokens_sd"] and steps == stats["steps_sd"] and seconds > 0


def test_engine_counts_verified_rows_by_their_response_position(varied_qwen2, monkeypatch):
    import verl_tlt.policy.decode_stats as decode_stats

    monkeypatch.setattr(decode_stats, "POSITION_EDGES", (8,))  # buckets 0-7 and 8+ for a 21-token answer
    path, hf_model = varied_qwen2
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=4, drafter=HFModelDrafter(hf_model))
    params = SamplingParams(temperature=0, max_tokens=21, ignore_eos=True)
    engine.generate([[5, 6, 7], [8, 9]], params, strategy="4_1_4")
    stats = engine.stats.as_dict()
    # Positions 1, 6, 11, 16 before each step (the first token comes from the prefill): two rows each.
    assert stats["sd_rows_by_position"] == {"0-7": 4, "8+": 4}
    assert sum(stats["sd_tokens_by_position"].values()) == stats["tokens_sd"]
    assert stats["sd_tokens_by_position"]["0-7"] == 10 * 2  # a perfect drafter: 5 tokens a row
