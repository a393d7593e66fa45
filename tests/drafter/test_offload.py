"""The frozen target parts come back from a training device without a copy back (the meta device stands in)."""

from __future__ import annotations

import dataclasses

import torch

from verl_tlt.bench.engine_bench import MODELS
from verl_tlt.bench.random_target import model_spec
from verl_tlt.drafter.offload import FrozenOnload
from verl_tlt.modeling.model import CausalLM


def tiny(tied: bool = False) -> CausalLM:
    return CausalLM(dataclasses.replace(model_spec(MODELS["toy-1m"]), tie_word_embeddings=tied))


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
