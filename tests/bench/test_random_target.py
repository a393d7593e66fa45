"""Random-weight bench targets are built in place: in the requested dtype on the requested device, nothing wider."""

from __future__ import annotations

import torch

from verl_tlt.bench.random_target import build_target, model_spec, num_parameters, weight_bytes
from verl_tlt.bench.verify_bench import MODELS


def test_tiny_target_is_built_in_the_requested_dtype_and_restores_the_default():
    spec = model_spec(MODELS["qwen2-tiny"])
    model = build_target(spec, "cpu", torch.bfloat16)
    assert torch.get_default_dtype() == torch.float32
    assert {param.dtype for param in model.parameters()} == {torch.bfloat16}
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as the small bench models are
    assert 0.01 < model.model.layers[0].mlp.down_proj.weight.float().std() < 0.03  # transformers' std 0.02
    assert (model.model.norm.weight == 1).all() and (model.model.layers[0].self_attn.qkv_proj.bias == 0).all()


def test_seven_b_shape_builds_in_bf16_on_the_device_without_a_host_copy():
    # The meta device stands in for the GPU: if any tensor were made on the host first, it would not be on meta.
    spec = model_spec(MODELS["qwen2.5-7b"])
    model = build_target(spec, "meta", torch.bfloat16)
    params = list(model.parameters())
    assert {param.device.type for param in params} == {"meta"}
    assert {param.dtype for param in params} == {torch.bfloat16}
    assert model.lm_head.weight is not model.model.embed_tokens.weight  # Qwen2.5-7B has its own LM head
    # Qwen2.5-7B's published size: 7,615,616,512 parameters, 15.2 GB in bf16.
    assert num_parameters(spec) == sum(param.numel() for param in params) == 7_615_616_512
    assert weight_bytes(spec, torch.bfloat16) == 2 * 7_615_616_512
    assert (spec.head_dim, spec.num_kv_heads, spec.intermediate_size) == (128, 4, 18944)
