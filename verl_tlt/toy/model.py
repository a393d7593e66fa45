"""A randomly initialised ~1M-parameter Qwen2 model over the toy tokenizer.

Why Qwen2: it is a stock `transformers` architecture that verl, vLLM and the torch engine all load by
`config.json` alone, so the toy target exercises the same code paths as a real model. The default sizes (hidden
128, 4 layers, GQA 4/2 heads) are about the smallest at which `csub` trains to ~99% accuracy, in ~5 CPU minutes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

# Named model shapes for the toy target. "default" is build_tiny_model's own defaults, the measured ~1M model above.
# "deep" has about the same parameter count in twice the layers, so that a 1-layer EAGLE drafter costs about 1/8 of
# a target step instead of 1/4, nearer real targets (28+ layers); `verl-tlt bench sd curve --toy-shape deep` measures
# what that does to SD.
TOY_SHAPES: Mapping[str, Mapping[str, int]] = {
    "default": {},
    "deep": {"hidden_size": 96, "num_layers": 8, "intermediate_size": 384},
}


def shape_kwargs(shape: str) -> Mapping[str, int]:
    """build_tiny_model keyword arguments of a named toy shape."""
    if shape not in TOY_SHAPES:
        raise ValueError(f"Unknown toy shape {shape!r}; choose from {sorted(TOY_SHAPES)}")
    return TOY_SHAPES[shape]


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    max_position_embeddings: int = 2048,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A freshly initialised fp32 Qwen2ForCausalLM (tied embeddings, sdpa) whose vocab and special ids match
    `tokenizer`. The same arguments always give the same weights; the global torch RNG is left untouched."""
    if hidden_size % num_heads != 0:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads ({num_heads}) must be divisible by num_kv_heads ({num_kv_heads}) for GQA")
    special_ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    missing = [name for name, token_id in special_ids.items() if token_id is None]
    if missing:
        raise ValueError(f"tokenizer lacks {missing}; build it with verl_tlt.toy.tokenizer.build_tokenizer()")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        use_sliding_window=False,
        **special_ids,
    )
    # For this in-memory model only: config.json does not store it. from_pretrained picks sdpa by itself;
    # verl defaults to flash_attention_2 and needs override_config.attn_implementation=sdpa on CPU.
    config._attn_implementation = "sdpa"
    # fork_rng: seeding must not change the caller's random stream (tests and training share the process).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(**special_ids)
    return model.eval()
