"""Pieces of the engine's model module that the engine tests reach only indirectly."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.modeling.model import AttentionBatch, RotaryEmbedding, rotate_half


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_table_rows_equal_the_direct_computation(dtype):
    rotary = RotaryEmbedding(head_dim=32, theta=10000.0)
    positions = torch.tensor([[0, 5, 300], [1023, 7, 2]])
    direct = rotary(positions, dtype)
    small = rotary(torch.tensor([[3]]), dtype, max_position=4)  # builds a short table first, then grows it
    from_table = rotary(positions, dtype, max_position=1024)
    assert small[0].dtype == dtype and from_table[0].shape == direct[0].shape
    for table_part, direct_part in zip(from_table, direct, strict=True):
        torch.testing.assert_close(table_part, direct_part, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_attention_batchs_rotation_is_rotate_halfs_bit_for_bit(dtype):
    cos, sin = RotaryEmbedding(head_dim=64, theta=10000.0)(torch.tensor([[3, 17], [900, 2]]), dtype)
    batch = AttentionBatch(
        row_start=0, write_pos=torch.zeros(2, 2, dtype=torch.long), attn_mask=None, cos=cos, sin=sin, kv_len=1
    )
    qk = torch.randn(2, 2, 12, 64, dtype=dtype)[:, :, :9]  # heads sliced off, as the fused projection leaves them
    reference = qk * cos.unsqueeze(2) + rotate_half(qk) * sin.unsqueeze(2)
    rolled_cos, signed_sin = batch.rotary()
    assert torch.equal(qk * rolled_cos + torch.roll(qk, 32, dims=-1) * signed_sin, reference)
    assert batch.rotary()[1] is signed_sin  # built once per forward, shared by the layers


def test_rotary_table_is_usable_by_training_code_after_inference():
    rotary = RotaryEmbedding(head_dim=8, theta=10000.0)
    with torch.inference_mode():
        rotary(torch.tensor([[1, 2]]), torch.float32, max_position=16)
    weight = torch.ones(8, requires_grad=True)
    cos, _ = rotary(torch.tensor([[1, 2]]), torch.float32, max_position=16)
    (cos * weight).sum().backward()  # an inference-mode table would refuse to be saved for backward
    assert weight.grad is not None


def test_attention_batch_without_a_mask_needs_its_length():
    positions = torch.tensor([[4]])
    cos = sin = torch.zeros(1, 1, 8)
    assert AttentionBatch(0, positions, None, cos, sin, kv_len=5).kv_len == 5
    assert AttentionBatch(0, positions, torch.ones(1, 1, 1, 7, dtype=torch.bool), cos, sin).kv_len == 7
    with pytest.raises(ValueError, match="kv_len"):
        AttentionBatch(0, positions, None, cos, sin)


def test_attention_batch_segments_need_one_packed_row_with_a_mask_and_whole_key_blocks():
    cos = sin = torch.zeros(1, 4, 8)
    write_pos = torch.arange(4).unsqueeze(0)
    mask = torch.ones(1, 1, 4, 8, dtype=torch.bool)
    AttentionBatch(0, write_pos, mask, cos, sin, segments=((0, 2), (2, 4)), key_block=4)  # two blocks of 4 keys
    with pytest.raises(ValueError, match="one packed row"):
        AttentionBatch(0, write_pos, None, cos, sin, kv_len=8, segments=((0, 4),), key_block=4)
    with pytest.raises(ValueError, match="one packed row"):
        AttentionBatch(0, write_pos.expand(2, 4), mask.expand(2, 1, 4, 8), cos, sin, segments=((0, 4),), key_block=4)
    with pytest.raises(ValueError, match="key_block"):
        AttentionBatch(0, write_pos, mask, cos, sin, segments=((0, 4),), key_block=3)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_drafter_shared_views_are_the_embedding_and_an_untied_lm_head(arch, tmp_path):
    from tests.engine.conftest import build_tiny_model
    from verl_tlt.modeling.weights import load_pretrained

    build_tiny_model(arch, tmp_path)  # qwen2 ties its LM head to the embedding here, llama does not
    model, _ = load_pretrained(str(tmp_path))
    shared = model.drafter_shared_views()
    expected = ["model.embed_tokens.weight"] + ([] if arch == "qwen2" else ["lm_head.weight"])
    assert sorted(shared) == sorted(expected)
    assert shared["model.embed_tokens.weight"].data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if arch == "llama":
        assert shared["lm_head.weight"].data_ptr() == model.lm_head.weight.data_ptr()
