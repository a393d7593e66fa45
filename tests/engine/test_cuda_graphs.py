"""The CUDA-graph pool's static-shape path, checked off CUDA (capture=False replays it eagerly).

Padding rows up to a batch bucket, masks over the whole cache, the copies in and out: all must leave the engine's
output exactly as without the pool. The captures themselves are checked by the gpu tests (test_engine_cuda.py).
"""

from __future__ import annotations

import logging

import pytest
import torch

from tests.engine.conftest import assert_same_outputs
from tests.engine.drafters import HFModelDrafter
from verl_tlt.config import SpeculativeConfig
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.cuda_graphs import MAX_GRAPH_BATCH, StepGraphPool, graph_batch_buckets
from verl_tlt.engine.kv_cache import SlotKVCache
from verl_tlt.policy.adaptive import AdaptivePolicy

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20], [21], [30, 31, 32]]


def varied_lengths(params: SamplingParams) -> list[SamplingParams]:
    """One SamplingParams per prompt with different max_tokens: rows leave one by one (batch 5, 4, 3, 2, 1)."""
    return [SamplingParams(**{**params.__dict__, "max_tokens": 8 + 4 * i}) for i in range(len(PROMPTS))]


GREEDY = varied_lengths(SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
SAMPLED = varied_lengths(SamplingParams(temperature=0.8, top_p=0.9, max_tokens=1, ignore_eos=True, seed=2))


def engine_pair(varied_qwen2, **kwargs):
    """An ordinary engine and one whose decode/verify steps go through the pool (5 slots: buckets 1, 2, 4, 5)."""
    path, hf_model = varied_qwen2
    engines = [
        RolloutEngine.from_pretrained(str(path), max_num_seqs=5, drafter=HFModelDrafter(hf_model, noise=1.0), **kwargs)
        for _ in range(2)
    ]
    engines[1].enable_step_graphs(capture=False)
    return engines


def test_batch_buckets_are_powers_of_two_up_to_the_batch_limit():
    assert graph_batch_buckets(1) == [1]
    assert graph_batch_buckets(6) == [1, 2, 4, 6]
    assert graph_batch_buckets(16) == [1, 2, 4, 8, 16]
    assert graph_batch_buckets(10_000)[-1] == MAX_GRAPH_BATCH


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("strategy", [None, "4_1_4", "3_3_8"], ids=["plain", "chain", "tree"])
def test_static_steps_decode_exactly_like_the_ordinary_forward(varied_qwen2, params, strategy):
    plain, pooled = engine_pair(varied_qwen2)
    assert_same_outputs(pooled.generate(PROMPTS, params, strategy=strategy), plain.generate(PROMPTS, params, strategy))
    report = pooled.runner.graphs.memory_report()
    width = 1 if strategy is None else int(strategy.split("_")[2]) + 1
    assert f"width{width}_batch5" in report["keys"]  # prefill never goes through the pool; decode steps do
    assert report["replays"] > report["graphs"] == report["captures"] and report["static_bytes"] > 0
    if strategy is None:  # one row leaves per step: batch 3 ran padded to bucket 4
        assert "width1_batch4" in report["keys"] and report["padded_rows"] > 0
    if strategy is not None and params is GREEDY:  # and greedy speculation is still plain decoding's output
        assert_same_outputs(pooled.generate(PROMPTS, params, strategy=strategy), plain.generate(PROMPTS, params))


def test_padding_rows_write_only_past_every_real_position(varied_qwen2):
    plain, pooled = engine_pair(varied_qwen2)
    pooled.generate(PROMPTS[:3], GREEDY[:3], strategy="4_1_4")
    # The scratch column lies beyond every position a token or a draft node can be written to.
    assert pooled.runner.graphs.scratch_column == pooled.max_model_len + pooled.max_draft_tokens
    assert pooled.runner.graphs.scratch_column == pooled.cache.max_len - 1


def test_released_or_reallocated_cache_drops_the_graphs(varied_qwen2):
    plain, pooled = engine_pair(varied_qwen2)
    reference = plain.generate(PROMPTS, GREEDY)
    pooled.generate(PROMPTS, GREEDY)
    captures = pooled.runner.graphs.num_captures
    pooled.release_cache()  # what a sleeping rollout does
    assert pooled.runner.graphs.memory_report()["graphs"] == 0
    assert_same_outputs(pooled.generate(PROMPTS, GREEDY), reference)
    assert pooled.runner.graphs.num_captures > captures
    # More slots than the pool allocated: the cache is reallocated under the graphs, which are dropped, not reused.
    captures = pooled.runner.graphs.num_captures
    pooled.cache.ensure_capacity(pooled.cache.num_slots + 1, pooled.cache.max_len)
    assert_same_outputs(pooled.generate(PROMPTS, GREEDY), reference)
    assert pooled.runner.graphs.num_captures > captures


def test_with_a_policy_only_its_strategies_widths_are_served_up_to_its_threshold(varied_qwen2):
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]), max_num_seqs=8)
    engine.policy = AdaptivePolicy(SpeculativeConfig(threshold=4, buckets=(1, 2, 4), strategies=("4_1_4", "3_3_8")))
    graphs = engine.enable_step_graphs(capture=False)
    assert graphs.serves(1, 8) and graphs.serves(5, 4) and graphs.serves(9, 1)
    assert not graphs.serves(5, 5)  # above the threshold: the policy decodes plainly there
    assert not graphs.serves(6, 1)  # not a width of the policy's strategies
    assert not graphs.serves(1, 9)  # above max_num_seqs


def test_cuda_graphs_off_cuda_warn_and_decode_without_them(varied_qwen2, caplog):
    with caplog.at_level(logging.WARNING):
        engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]), cuda_graphs=True)
    assert "CUDA graphs need CUDA" in caplog.text
    engine.generate(PROMPTS[:2], GREEDY[:2])
    assert engine.runner.graphs is None
    cache = SlotKVCache(engine.model.spec, dtype=torch.float32, device="cpu", max_len=64)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA cache"):
        StepGraphPool(engine.model, cache, 16, torch.float32, batch_buckets=[1])
