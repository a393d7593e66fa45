"""The roofline cost model on numbers worked out by hand."""

from __future__ import annotations

import pytest

from verl_tlt.sim.roofline import ACCELERATORS, MODELS, Accelerator, DraftLevelCost, ModelShape, RooflineCost

# A shape small enough to count by hand: 2 layers, hidden 4, 2 heads of 2, 1 KV head, MLP 8, vocab 10.
TINY = ModelShape("tiny", layers=2, hidden=4, intermediate=8, heads=2, kv_heads=1, vocab=10)
UNIT = Accelerator("unit", hbm_bytes_per_s=1000.0, peak_flops=1000.0, memory_bytes=1e9)


def test_parameter_and_kv_counts_follow_the_shape():
    # q and o: 4 x 4 each; k and v: 4 x 2 each; MLP: 3 x 4 x 8.
    assert TINY.layer_params == 16 + 16 + 8 + 8 + 96
    assert TINY.params == 2 * 144 + 2 * 10 * 4  # untied: embedding and output head
    assert TINY.matmul_params == 2 * 144 + 40
    assert TINY.kv_bytes_per_token(2) == 2 * 2 * 1 * 2 * 2  # k and v, 2 layers, 1 head of 2, 2 bytes


def test_the_published_shapes_have_their_known_sizes():
    assert MODELS["qwen2.5-7b"].params == pytest.approx(7.6e9, rel=0.01)
    assert MODELS["qwen2.5-32b"].params == pytest.approx(32.8e9, rel=0.01)
    assert MODELS["qwen2.5-7b"].kv_bytes_per_token() == 57344  # 28 layers x 4 KV heads x 128 x 2 (k, v) x 2 bytes


def test_a_small_step_is_bound_by_memory_and_a_large_one_by_compute():
    cost = RooflineCost(TINY, UNIT, bandwidth_efficiency=1.0, flops_efficiency=1.0)
    weights = TINY.params * 2
    assert cost.step_seconds(1, 1) == pytest.approx(weights / 1000.0)  # 2 * 328 FLOPs < 736 bytes
    big = cost.step_seconds(100, 4)
    assert big == pytest.approx(2 * TINY.matmul_params * 400 / 1000.0)


def test_the_kv_cache_adds_bytes_and_attention_flops():
    cost = RooflineCost(TINY, UNIT, bandwidth_efficiency=1.0, flops_efficiency=1.0)
    assert cost.bytes_per_gpu(10) - cost.bytes_per_gpu(0) == 10 * TINY.kv_bytes_per_token(2)
    assert cost.flops_per_gpu(1, 1, 10) - cost.flops_per_gpu(1, 1, 0) == 4 * 2 * 2 * 2 * 10


def test_tensor_parallelism_splits_the_work_and_adds_all_reduces():
    one = RooflineCost(TINY, UNIT, tp=1, allreduce_s=0.5)
    four = RooflineCost(TINY, UNIT, tp=4, allreduce_s=0.5)
    assert four.bytes_per_gpu(0) == one.bytes_per_gpu(0) / 4
    assert four.step_seconds(1) == pytest.approx(one.step_seconds(1) / 4 + 2 * TINY.layers * 0.5)


def test_efficiencies_and_overhead_scale_as_stated():
    full = RooflineCost(TINY, UNIT, bandwidth_efficiency=1.0, flops_efficiency=1.0)
    half = RooflineCost(TINY, UNIT, bandwidth_efficiency=0.5, flops_efficiency=1.0, step_overhead_s=3.0)
    assert half.step_seconds(1) == pytest.approx(2 * full.step_seconds(1) + 3.0)


def test_a_drafter_level_is_its_fixed_cost_plus_a_one_layer_head():
    target = RooflineCost(TINY, UNIT, bandwidth_efficiency=1.0, flops_efficiency=1.0)
    level = DraftLevelCost(target, level_s=2.0)
    params = TINY.layer_params + TINY.vocab * TINY.hidden + 2 * TINY.hidden * TINY.hidden
    assert level.step_seconds(1) == pytest.approx(2.0 + params * 2 / 1000.0)


@pytest.mark.parametrize("key,value", [("tp", 0), ("bandwidth_efficiency", 0.0), ("flops_efficiency", 1.5)])
def test_bad_settings_are_refused_by_name(key, value):
    with pytest.raises(ValueError, match=key):
        RooflineCost(TINY, ACCELERATORS["h100-sxm"], **{key: value})
