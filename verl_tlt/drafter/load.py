"""Reading an EAGLE-1 drafter export (`verl_tlt.drafter.export`) back, validated against the target it attaches to.

Why validate: a drafter loaded under the wrong target, with a tensor missing or a bias flag that disagrees with its
tensors, would not fail: it would draft badly and silently cost speed. Every such problem raises ValueError naming
the path, what was expected and what was found.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from verl_tlt.drafter.draft_vocab import DraftVocab
from verl_tlt.drafter.export import (
    CONFIG_FILE,
    DRAFT_VOCAB_FILE,
    FORMAT_VERSION,
    SUPPORTED_ARCHITECTURES,
    WEIGHTS_FILE,
    hf_views,
    size_mismatches,
)
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.modeling.model import CausalLM, ModelSpec

# Tensors of the target that a checkpoint may carry if (and only if) they equal the target's: they are shared.
_SHARED_WITH_TARGET = {"embed_tokens.weight": "model.embed_tokens.weight", "lm_head.weight": "lm_head.weight"}


def load_eagle(path: str | os.PathLike, target: CausalLM) -> EagleDrafterModel:
    """Read an EAGLE-1 export back as an `EagleDrafterModel` attached to `target`, validating it first.

    Every problem (not an export, unsupported architecture, sizes that do not fit the target, missing, unknown or
    misshapen tensors, an unreadable safetensors file) raises ValueError naming the path, what was expected and
    what was found, so a bad checkpoint never becomes a silently wrong drafter.
    """
    path = Path(path)
    config = read_export_config(path)
    spec = drafter_layer_spec(config, target.spec, path)
    tensors = read_export_tensors(path)
    param = target.lm_head.weight
    drafter = EagleDrafterModel(spec).to(device=param.device, dtype=param.dtype)
    _copy_tensors(drafter, tensors, target, path)
    drafter.attach(target)
    drafter.set_draft_vocab(_read_draft_vocab(path, spec.vocab_size))
    return drafter


def _read_draft_vocab(path: Path, vocab_size: int) -> DraftVocab | None:
    """The export's draft vocabulary, None if it has none (it drafts over the whole vocabulary)."""
    file = path / DRAFT_VOCAB_FILE
    if not file.is_file():
        return None
    try:
        saved = json.loads(file.read_text())
        ids, capacity = saved["ids"], saved["capacity"]
        if not (isinstance(ids, list) and all(isinstance(i, int) for i in ids) and isinstance(capacity, int)):
            raise ValueError("'ids' must be a list of token ids and 'capacity' an integer")
        return DraftVocab(torch.tensor(ids, dtype=torch.long), vocab_size, capacity)
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{file} is not a draft vocabulary of this target ({error}); re-export the drafter") from error


def read_export_config(path: Path) -> dict:
    file = path / CONFIG_FILE
    if not file.is_file():
        raise ValueError(
            f"{path} is not an EAGLE export: no {CONFIG_FILE} (expected {CONFIG_FILE} + {WEIGHTS_FILE}, "
            "as written by export_eagle)"
        )
    try:
        config = json.loads(file.read_text())
    except ValueError as err:
        raise ValueError(f"{file} is not valid JSON ({err}); re-export the drafter") from err
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object, found {type(config).__name__}")
    block = config.get("verl_tlt")
    version = block.get("format_version", FORMAT_VERSION) if isinstance(block, dict) else FORMAT_VERSION
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"{file} has verl_tlt format_version {version}; this verl_tlt reads up to {FORMAT_VERSION}. "
            "Upgrade verl_tlt."
        )
    return config


def drafter_layer_spec(config: dict, target: ModelSpec, path: Path) -> ModelSpec:
    """The drafter layer's ModelSpec: sizes must equal the target's; biases, q/k norms and eps come from config."""
    model_type = _check_architecture(config, path)
    _check_eagle1_fields(config, path)
    draft = _spec_from_config(config, model_type, target, path)
    mismatches = size_mismatches(draft, target)
    if mismatches:
        raise ValueError(
            f"EAGLE drafter at {path} does not fit the target ({target.model_type}): {'; '.join(mismatches)} "
            "(drafter vs target). Load it with the target it was trained for, or export a drafter for this target."
        )
    return draft


def _check_architecture(config: dict, path: Path) -> str:
    architectures = config.get("architectures")
    names = architectures if isinstance(architectures, list) else [architectures]
    found = [name for name in names if name in SUPPORTED_ARCHITECTURES]
    if len(names) != 1 or not found:
        raise ValueError(
            f"{path / CONFIG_FILE}: unsupported EAGLE drafter architectures {architectures!r}; expected one of "
            f"{sorted(SUPPORTED_ARCHITECTURES)} (one Llama or Qwen3 decoder layer)"
        )
    model_type = SUPPORTED_ARCHITECTURES[found[0]]
    if config.get("model_type") != model_type:
        raise ValueError(
            f"{path / CONFIG_FILE}: architecture {found[0]} needs model_type {model_type!r}, "
            f"found {config.get('model_type')!r}"
        )
    return model_type


def _check_eagle1_fields(config: dict, path: Path) -> None:
    """Fields whose other values describe a drafter this module cannot build (and vLLM would build differently)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope = rope if isinstance(rope, dict) else {"rope_type": rope}
    checks = [
        ("num_hidden_layers", config.get("num_hidden_layers"), 1),
        ("hidden_act", config.get("hidden_act", "silu"), "silu"),
        ("bias (fc bias)", bool(config.get("bias", False)), False),
        ("mlp_bias", bool(config.get("mlp_bias", False)), False),
        ("rope_type", rope.get("rope_type", rope.get("type", "default")), "default"),
    ]
    for name, found, expected in checks:
        if found != expected:
            raise ValueError(
                f"{path / CONFIG_FILE}: {name} is {found!r}, an EAGLE drafter here needs {expected!r} "
                "(one Llama-style decoder layer, fc without bias, SiLU MLP without bias, default RoPE)"
            )


def _spec_from_config(config: dict, model_type: str, target: ModelSpec, path: Path) -> ModelSpec:
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        rope = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
        values = {
            "hidden_size": hidden,
            "vocab_size": int(config["vocab_size"]),
            "num_heads": heads,
            "num_kv_heads": int(config.get("num_key_value_heads") or heads),
            "head_dim": int(config.get("head_dim") or hidden // heads),
            "intermediate_size": int(config["intermediate_size"]),
            "rms_norm_eps": float(config["rms_norm_eps"]),
            "rope_theta": float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        }
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path / CONFIG_FILE}: missing or malformed size field ({err!r})") from err
    qkv_bias, o_bias = _biases(config, model_type)
    return dataclasses.replace(
        target, attention_bias=qkv_bias, output_bias=o_bias, qk_norm=model_type == "qwen3", **values
    )


def _biases(config: dict, model_type: str) -> tuple[bool, bool]:
    """(q/k/v bias, o_proj bias) as vLLM's LlamaDecoderLayer derives them; Qwen3 has one flag for all four."""
    attention_bias = bool(config.get("attention_bias", False) or config.get("bias", False))
    if model_type == "qwen3":
        return attention_bias, attention_bias
    qkv_bias = bool(config["qkv_bias"]) if "qkv_bias" in config else attention_bias
    return qkv_bias, attention_bias


def read_export_tensors(path: Path) -> dict[str, torch.Tensor]:
    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise ValueError(f"{path} has no {WEIGHTS_FILE}; an EAGLE export holds {CONFIG_FILE} + {WEIGHTS_FILE}")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(
            f"{file} is not a readable safetensors file ({err}); the export is corrupt, re-export"
        ) from err


def _copy_tensors(drafter: EagleDrafterModel, tensors: dict[str, torch.Tensor], target: CausalLM, path: Path) -> None:
    """Copy checkpoint tensors into the drafter after checking the name sets and every shape."""
    shared = check_shared_tensors(tensors, target, path)
    hint = "(q_norm/k_norm belong to the qwen3 layout; fc.bias is not supported.)"
    copy_checked(hf_views(drafter), {k: v for k, v in tensors.items() if k not in shared}, path, "EAGLE-1", hint)


def copy_checked(views: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], path: Path, what: str, hint: str):
    """Copy `tensors` into `views` (export name -> the parameter's view) once the names match exactly and every
    shape fits: ValueError naming the file, the tensors and `hint` otherwise (nothing is copied then)."""
    unknown, missing = sorted(set(tensors) - set(views)), sorted(set(views) - set(tensors))
    if unknown:
        raise ValueError(
            f"{path / WEIGHTS_FILE} has tensor(s) an {what} drafter of this config does not have: {unknown[:5]}. "
            f"Expected exactly {sorted(views)}. {hint}"
        )
    if missing:
        raise ValueError(f"{path / WEIGHTS_FILE} is missing tensor(s) {missing[:5]}; re-export the drafter")
    wrong = [
        f"{name}: expected {tuple(view.shape)}, found {tuple(tensors[name].shape)}"
        for name, view in views.items()
        if tensors[name].shape != view.shape or not tensors[name].is_floating_point()
    ]
    if wrong:
        raise ValueError(f"{path / WEIGHTS_FILE} has tensors of the wrong shape or dtype: {'; '.join(wrong[:5])}")
    with torch.no_grad():
        for name, view in views.items():
            view.copy_(tensors[name].to(dtype=view.dtype, device=view.device))


def check_shared_tensors(tensors: dict[str, torch.Tensor], target: CausalLM, path: Path) -> set[str]:
    """Embedding / LM head copies are accepted only if equal to the target's: the drafter shares the target's."""
    present = set(tensors) & set(_SHARED_WITH_TARGET)
    target_params = dict(target.named_parameters(remove_duplicate=False))
    for name in present:
        own = target_params[_SHARED_WITH_TARGET[name]]
        tensor = tensors[name]
        if tensor.shape != own.shape or not torch.equal(tensor.to(device=own.device, dtype=own.dtype), own):
            raise ValueError(
                f"{path / WEIGHTS_FILE} carries its own {name} {tuple(tensor.shape)} that differs from the target's "
                f"{tuple(own.shape)}; this drafter shares the target's embedding and LM head. Remove the tensor "
                "or load the drafter with the target it came from."
            )
    return present
