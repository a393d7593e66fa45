"""Decode counters: acceptance length per strategy, over one engine and over several replicas."""

from __future__ import annotations

import pytest

from verl_tlt.engine.decode_stats import DecodeStats, strategy_acceptance
from verl_tlt.spec.strategy import SpecStrategy


def test_acceptance_per_strategy_is_tokens_committed_per_verified_row():
    stats = DecodeStats()
    chain4, chain2 = SpecStrategy.parse("4_1_4"), SpecStrategy.parse("2_1_2")
    stats.record(chain4, batch_size=2, tokens=9, seconds=0.1)  # rows committed 5 and 4
    stats.record(chain4, batch_size=1, tokens=2, seconds=0.1)
    stats.record(chain2, batch_size=3, tokens=6, seconds=0.1)
    stats.record(None, batch_size=3, tokens=3, seconds=0.1)  # plain steps do not count
    assert stats.acceptance_by_strategy() == {"4_1_4": pytest.approx(11 / 3), "2_1_2": 2.0}
    other = DecodeStats()
    other.record(chain4, batch_size=1, tokens=5, seconds=0.1)
    merged = strategy_acceptance([stats.as_dict(), other.as_dict(), {"steps_plain": 1}])
    assert merged == {"4_1_4": pytest.approx(16 / 4), "2_1_2": 2.0}


def test_engine_counts_every_speculative_token_under_its_strategy(varied_qwen2):
    from tests.engine.drafters import HFModelDrafter
    from verl_tlt.engine import RolloutEngine, SamplingParams

    path, hf_model = varied_qwen2
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=4, drafter=HFModelDrafter(hf_model))
    params = SamplingParams(temperature=0, max_tokens=21, ignore_eos=True)
    engine.generate([[5, 6, 7], [8, 9]], params, strategy="4_1_4")
    stats = engine.stats.as_dict()
    assert stats["sd_tokens_by_strategy"] == {"4_1_4": stats["tokens_sd"]}
    # A perfect drafter: every verified row commits 5 tokens, except where max_tokens cuts the last draft (20 = 4 x 5).
    assert engine.stats.acceptance_by_strategy()["4_1_4"] == pytest.approx(5.0)
