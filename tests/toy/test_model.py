"""The tiny Qwen2 target: size, special ids, forward pass and seeding."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.toy.model import build_tiny_model


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer)


def test_default_model_has_about_one_million_parameters_with_tied_embeddings(model):
    assert 0.95e6 <= model.num_parameters() <= 1.05e6
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.config.tie_word_embeddings
    assert model.config._attn_implementation == "sdpa"


def test_config_and_generation_config_carry_the_tokenizer_special_ids(model, tokenizer):
    assert model.config.vocab_size == len(tokenizer)
    for config in (model.config, model.generation_config):
        assert config.bos_token_id == tokenizer.bos_token_id
        assert config.eos_token_id == tokenizer.eos_token_id
        assert config.pad_token_id == tokenizer.pad_token_id == 0


def test_forward_on_a_padded_batch_returns_finite_logits_over_the_vocab(model, tokenizer):
    batch = tokenizer(
        ["<bos>11 : 4<sep>", "<bos>7 : 2<sep>"], add_special_tokens=False, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, batch["input_ids"].shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_same_seed_gives_same_weights_and_leaves_the_global_rng_alone(tokenizer):
    torch.manual_seed(123)
    expected_draw = torch.rand(1)
    torch.manual_seed(123)
    first = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, intermediate_size=64, seed=7)
    assert torch.equal(torch.rand(1), expected_draw)
    second = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, intermediate_size=64, seed=7)
    third = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, intermediate_size=64, seed=8)
    first_weights, second_weights, third_weights = (m.state_dict() for m in (first, second, third))
    assert all(torch.equal(first_weights[k], second_weights[k]) for k in first_weights)
    assert not torch.equal(first_weights["lm_head.weight"], third_weights["lm_head.weight"])


def test_bad_head_counts_raise_clear_errors(tokenizer):
    with pytest.raises(ValueError, match="divisible by num_heads"):
        build_tiny_model(tokenizer, hidden_size=130)
    with pytest.raises(ValueError, match="divisible by num_kv_heads"):
        build_tiny_model(tokenizer, num_kv_heads=3)


def test_the_deep_shape_keeps_the_size_in_twice_the_layers(tokenizer):
    from verl_tlt.toy.model import shape_kwargs

    deep = build_tiny_model(tokenizer, **shape_kwargs("deep"))
    assert deep.config.num_hidden_layers == 8 and 0.95e6 <= deep.num_parameters() <= 1.15e6
    with pytest.raises(ValueError, match="Unknown toy shape 'wide'"):
        shape_kwargs("wide")
