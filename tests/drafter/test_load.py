"""EAGLE drafter loading: every kind of bad export is a clear error naming the path; shared tensors are checked."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from verl_tlt.drafter import load_eagle
from verl_tlt.modeling.model import CausalLM

# ----- bad checkpoints ------------------------------------------------------------------------------------------


def edit_config(path: Path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **changes}))


def edit_tensors(path: Path, edit) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_rejects_a_target_of_another_size(exported):
    path, target = exported
    other = CausalLM(dataclasses.replace(target.spec, hidden_size=32))
    with pytest.raises(ValueError, match=r"does not fit the target.*hidden_size: 64 vs 32") as error:
        load_eagle(path, other)
    assert str(path) in str(error.value)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: edit_tensors(p, lambda t: t.pop("layers.0.mlp.up_proj.weight")), r"missing.*mlp\.up_proj"),
        (
            lambda p: edit_tensors(p, lambda t: t.update({"layers.0.self_attn.q_norm.weight": torch.ones(16)})),
            r"does not have.*q_norm",
        ),
        (lambda p: edit_tensors(p, lambda t: t.update({"fc.weight": torch.zeros(64, 64)})), r"fc\.weight.*\(64, 128\)"),
        (
            lambda p: edit_tensors(p, lambda t: t.update({"embed_tokens.weight": torch.zeros(97, 64)})),
            r"embed_tokens.*differs from the target",
        ),
        (lambda p: (p / "model.safetensors").write_bytes(b"\x00garbage" * 4), r"not a readable safetensors"),
        (lambda p: (p / "model.safetensors").unlink(), r"has no model\.safetensors"),
        (lambda p: (p / "config.json").write_text("{not json"), r"not valid JSON"),
        (lambda p: edit_config(p, architectures=["Qwen2ForCausalLM"]), r"unsupported.*'Qwen2ForCausalLM'"),
        (lambda p: edit_config(p, model_type="mistral"), r"needs model_type 'llama', found 'mistral'"),
        (lambda p: edit_config(p, num_hidden_layers=2), r"num_hidden_layers is 2.*needs 1"),
        (lambda p: edit_config(p, bias=True), r"fc bias"),
        (lambda p: edit_config(p, qkv_bias=False), r"does not have.*q_proj\.bias"),
        (lambda p: edit_config(p, verl_tlt={"format_version": 99}), r"format_version 99"),
    ],
    ids=[
        "missing-tensor",
        "unknown-tensor",
        "wrong-shape",
        "own-embedding",
        "corrupt-safetensors",
        "no-safetensors",
        "corrupt-config",
        "wrong-architecture",
        "wrong-model-type",
        "two-layers",
        "fc-bias",
        "bias-flags-disagree-with-tensors",
        "newer-format",
    ],
)
def test_bad_checkpoints_raise_clear_errors(exported, damage, message):
    path, target = exported
    damage(path)
    with pytest.raises(ValueError, match=message) as error:
        load_eagle(path, target)
    assert str(path) in str(error.value)


def test_an_embedding_equal_to_the_targets_is_accepted(exported):
    path, target = exported
    edit_tensors(path, lambda t: t.update({"embed_tokens.weight": target.model.embed_tokens.weight.detach().clone()}))
    assert load_eagle(path, target).target is target


def test_missing_directory_is_not_an_export(tmp_path, targets):
    with pytest.raises(ValueError, match="not an EAGLE export"):
        load_eagle(tmp_path / "nowhere", targets["qwen2"][0].model)
