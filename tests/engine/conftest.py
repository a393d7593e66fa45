from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

EOS = 3
ARCHS = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 16}),
    "llama": (LlamaConfig, LlamaForCausalLM, {"attention_bias": True}),
}


def build_tiny_model(
    arch: str,
    path,
    seed: int = 0,
    vocab_size: int = 97,
    weight_std: float | None = None,
    intermediate_size: int = 128,
    num_layers: int = 2,
):
    """A random tiny model of `arch`, saved to `path`; returns the transformers model (fp32, eval).

    weight_std re-draws every matrix with that std: larger weights make outputs depend on the context (the default
    init repeats one token under greedy decoding, which would make draft-acceptance tests trivial).
    """
    config_cls, model_cls, extra = ARCHS[arch]
    torch.manual_seed(seed)
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=intermediate_size,
        tie_word_embeddings=arch != "llama",
        eos_token_id=EOS,
        bos_token_id=1,
        pad_token_id=0,
        max_position_embeddings=512,
        **extra,
    )
    model = model_cls(config).eval()
    with torch.no_grad():  # random init has tiny biases/norms; widen them so the test exercises them
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
            elif weight_std is not None and param.dim() == 2:
                param.normal_(0.0, weight_std)
    model.save_pretrained(path)
    return model


def assert_same_outputs(outputs, reference, atol: float = 1e-5) -> None:
    """Two engines' outputs for the same requests: same tokens and finish reasons, log-probs within atol."""
    for got, want in zip(outputs, reference, strict=True):
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason
        assert torch.allclose(torch.tensor(got.log_probs), torch.tensor(want.log_probs), atol=atol)


@pytest.fixture(scope="session")
def varied_qwen2(tmp_path_factory):
    """A tiny Qwen2 whose greedy outputs vary with the context (for speculative-decoding tests)."""
    path = tmp_path_factory.mktemp("varied_qwen2")
    return path, build_tiny_model("qwen2", path, weight_std=0.2)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen2")
    return path, build_tiny_model("qwen2", path)
