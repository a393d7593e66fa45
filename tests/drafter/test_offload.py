"""The frozen target parts come back from a training device without a copy back (the meta device stands in)."""

from __future__ import annotations

import torch

from verl_tlt.drafter.offload import FrozenOnload
from verl_tlt.modeling.model import CausalLM, ModelSpec


def tiny(tied: bool = False) -> CausalLM:
    spec = ModelSpec(
        model_type="qwen2",
        vocab_size=32,
        hidden_size=8,
        intermediate_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        attention_bias=False,
        output_bias=False,
        qk_norm=False,
        tie_word_embeddings=tied,
        max_position_embeddings=64,
    )
    return CausalLM(spec)


def test_the_offload_points_back_at_the_host_tensors_it_kept():
    model = tiny()
    before = {name: (p.data_ptr(), p.detach().clone()) for name, p in model.named_parameters()}
    onload = FrozenOnload(model, "meta")  # meta: a device that holds no data, so nothing could be copied back
    assert all(p.device.type == "meta" for p in model.parameters())
    onload.offload()
    for name, param in model.named_parameters():
        assert param.device.type == "cpu" and param.data_ptr() == before[name][0]  # the same host tensor
        assert torch.equal(param, before[name][1])
    assert all(buffer.device.type == "cpu" for buffer in model.buffers())


def test_a_tied_head_stays_tied_to_the_embedding():
    model = tiny(tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    FrozenOnload(model, "meta").offload()
    assert model.lm_head.weight is model.model.embed_tokens.weight and model.lm_head.weight.device.type == "cpu"
