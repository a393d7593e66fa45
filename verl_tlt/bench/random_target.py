"""Random-weight targets for the engine's benchmarks, built in place: on the device, in the dtype, no checkpoint.

Qwen2.5-7B in fp32 is 30 GB. Built through transformers on the host, saved and loaded again (what the small bench
models used to do), it would need that much host memory before the first byte reached the GPU. Here the engine's
own `CausalLM` is constructed under a default-device and a default-dtype context, so every parameter is allocated
where and as it will be used, then filled in place with transformers' Qwen2 init (weights normal with std 0.02,
biases 0, norms 1): nothing larger than the model itself ever exists, and nothing touches the disk.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from verl_tlt.bench.engine_bench import BenchModel, qwen2_config
from verl_tlt.modeling.model import CausalLM, ModelSpec, RMSNorm

# transformers' Qwen2Config.initializer_range: the same weight distribution as a transformers-built random model.
INIT_STD = 0.02


def model_spec(model: BenchModel) -> ModelSpec:
    """The engine's ModelSpec of a bench model, read from its transformers config (no weights are made)."""
    return ModelSpec.from_hf_config(qwen2_config(model))


def num_parameters(spec: ModelSpec) -> int:
    """Parameters of the engine's model for `spec` (a tied LM head counted once), counted on the meta device."""
    with torch.device("meta"):
        return sum(param.numel() for param in CausalLM(spec).parameters())


def weight_bytes(spec: ModelSpec, dtype: torch.dtype) -> int:
    return num_parameters(spec) * torch.empty((), dtype=dtype).element_size()


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default floating dtype set to `dtype` inside the block (process-wide, restored on exit)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@torch.no_grad()
def build_target(spec: ModelSpec, device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> CausalLM:
    """The engine's model for `spec` with random weights, allocated directly on `device` in `dtype`."""
    torch.manual_seed(seed)  # seeds the CPU and every CUDA device
    with torch.device(device), default_dtype(dtype):
        model = CausalLM(spec)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0.0, INIT_STD)  # a tied LM head is the embedding: filled twice, harmlessly
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif isinstance(module, RMSNorm):
            module.weight.fill_(1.0)
    return model.eval()
