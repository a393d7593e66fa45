"""EAGLE drafter export: exact round trips in vLLM's EAGLE-1 layout, atomic writes, refusals before writing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.drafter.conftest import ARCHS, trained_drafter
from verl_tlt.drafter import EagleDrafterModel, export_eagle, load_eagle
from verl_tlt.drafter import export as export_module
from verl_tlt.engine.drafts.base import DraftContext
from verl_tlt.engine.drafts.eagle import EagleDrafter

# What each target's drafter must look like on disk (see the export module docstring for the vLLM sources).
LAYOUT = {
    "qwen2": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "qkv_bias": True},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False},
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": True},
}


def drafts(model: EagleDrafterModel) -> list[torch.Tensor]:
    """Root logits plus two tree levels for a fixed context: the outputs speculative decoding consumes."""
    torch.manual_seed(1)
    drafter = EagleDrafter(model, max_len=64)
    sequence = [3, 17, 42, 8, 60, 9]
    hidden = torch.randn(len(sequence) - 1, model.spec.hidden_size)
    root = drafter.begin([DraftContext(sequence, 0, hidden)])
    level1 = drafter.expand(torch.tensor([[1, 2]]), torch.tensor([[0, 0]]), torch.tensor([[11, 12]]))
    level2 = drafter.expand(torch.tensor([[3]]), torch.tensor([[2]]), torch.tensor([[13]]))
    return [root, level1, level2]


# ----- round trip -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_round_trip_gives_identical_weights_and_drafts(targets, tmp_path, arch):
    engine, config = targets[arch]
    original = trained_drafter(engine.model)
    path = export_eagle(original, tmp_path / "eagle", target_config=config, metadata={"training_steps": 7})
    loaded = load_eagle(path, engine.model)

    assert loaded.spec == original.spec
    expected, found = original.state_dict(), loaded.state_dict()
    assert expected.keys() == found.keys()
    assert all(torch.equal(expected[name], found[name]) for name in expected)
    assert loaded.target is engine.model
    for a, b in zip(drafts(original), drafts(loaded), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("arch", ARCHS)
def test_files_follow_vllm_eagle1_layout(targets, tmp_path, arch):
    engine, target_config = targets[arch]
    spec = engine.model.spec
    path = export_eagle(trained_drafter(engine.model), tmp_path / "eagle", target_config=target_config)
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]

    config = json.loads((path / "config.json").read_text())
    expected = {
        **LAYOUT[arch],
        "num_hidden_layers": 1,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "bias": False,
        "tie_word_embeddings": False,
        "eos_token_id": target_config["eos_token_id"],
    }
    assert {key: config.get(key) for key in expected} == expected
    assert ("qkv_bias" in config) == (arch == "qwen2")  # vLLM applies qkv_bias whenever the key exists
    assert config["verl_tlt"]["target_model_type"] == arch

    tensors = load_file(str(path / "model.safetensors"))
    hidden = spec.hidden_size
    assert tensors["fc.weight"].shape == (hidden, 2 * hidden)
    layer = {name.removeprefix("layers.0.") for name in tensors if name != "fc.weight"}
    assert all(name.startswith("layers.0.") for name in tensors if name != "fc.weight")  # no "model." prefix
    projections = {f"self_attn.{p}_proj.weight" for p in "qkvo"} | {f"mlp.{p}_proj.weight" for p in ("gate", "up")}
    expected_layer = projections | {"mlp.down_proj.weight", "post_attention_layernorm.weight"}
    expected_layer |= {f"self_attn.{p}_proj.bias" for p in "qkv"} if arch != "qwen3" else set()
    expected_layer |= {"self_attn.o_proj.bias"} if arch == "llama" else set()
    expected_layer |= {"self_attn.q_norm.weight", "self_attn.k_norm.weight"} if arch == "qwen3" else set()
    assert layer == expected_layer  # no input_layernorm, embedding or LM head


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_transformers_parses_the_config_as_vllm_builds_the_layer(targets, tmp_path, arch):
    """vLLM reads the draft config with AutoConfig, then LlamaDecoderLayer derives the biases from it."""
    from transformers import AutoConfig

    engine, _ = targets[arch]
    spec = engine.model.spec
    path = export_eagle(trained_drafter(engine.model), tmp_path / "eagle")
    config = AutoConfig.from_pretrained(path)
    attention_bias = getattr(config, "attention_bias", False) or getattr(config, "bias", False)
    qkv_bias = config.qkv_bias if hasattr(config, "qkv_bias") else attention_bias  # vllm llama.py's rule
    assert (qkv_bias, attention_bias) == (spec.attention_bias, spec.output_bias)
    assert config.num_hidden_layers == 1 and config.head_dim == spec.head_dim
    assert config.rope_parameters["rope_theta"] == spec.rope_theta


def test_export_replaces_an_earlier_export(targets, tmp_path):
    engine, _ = targets["llama"]
    first, second = trained_drafter(engine.model, seed=1), trained_drafter(engine.model, seed=2)
    path = export_eagle(first, tmp_path / "eagle", metadata={"training_steps": 1})
    export_eagle(second, path, metadata={"training_steps": 2})
    assert torch.equal(load_eagle(path, engine.model).fc.weight, second.fc.weight)
    assert json.loads((path / "config.json").read_text())["verl_tlt"]["metadata"] == {"training_steps": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eagle"]  # no temporary or backup directories left


# ----- atomic writes ----------------------------------------------------------------------------------------------


def failing_save(tensors, filename, metadata=None):
    Path(filename).write_bytes(b"half a file")
    raise OSError("disk full")


def test_failed_export_leaves_no_directory(targets, tmp_path, monkeypatch):
    engine, _ = targets["qwen2"]
    monkeypatch.setattr(export_module, "save_file", failing_save)
    with pytest.raises(OSError, match="disk full"):
        export_eagle(trained_drafter(engine.model), tmp_path / "eagle")
    assert list(tmp_path.iterdir()) == []


def test_failed_export_keeps_the_previous_export(exported, tmp_path, monkeypatch):
    path, target = exported
    before = load_eagle(path, target).state_dict()
    monkeypatch.setattr(export_module, "save_file", failing_save)
    with pytest.raises(OSError, match="disk full"):
        export_eagle(trained_drafter(target, seed=5), path)
    after = load_eagle(path, target).state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eagle"]


def test_refuses_to_replace_a_foreign_directory(targets, tmp_path):
    engine, _ = targets["qwen2"]
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="refusing to replace"):
        export_eagle(trained_drafter(engine.model), tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_export_rejects_a_mismatched_target_config(targets, tmp_path):
    engine, config = targets["qwen2"]
    with pytest.raises(ValueError, match=r"hidden_size: 64 vs 32"):
        export_eagle(trained_drafter(engine.model), tmp_path / "eagle", target_config={**config, "hidden_size": 32})
    assert list(tmp_path.iterdir()) == []


def test_export_rejects_metadata_json_cannot_hold(targets, tmp_path):
    engine, _ = targets["qwen2"]
    with pytest.raises(ValueError, match="JSON-serialisable"):
        export_eagle(trained_drafter(engine.model), tmp_path / "eagle", metadata={"step": torch.tensor(3)})
    assert list(tmp_path.iterdir()) == []
