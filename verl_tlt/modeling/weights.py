"""Loading transformers checkpoints and streamed (name, tensor) updates into the engine's model."""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

import torch

from verl_tlt.modeling.model import CausalLM, ModelSpec

logger = logging.getLogger(__name__)

# Buffers some checkpoints carry that the engine recomputes itself.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_checkpoint(path: str, keep: Callable[[str], bool] | None = None) -> Iterable[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from a local transformers checkpoint directory; with `keep`, only the names it accepts
    (safetensors files are then read tensor by tensor, so the others are never loaded)."""
    if glob.glob(os.path.join(path, "*.safetensors")):
        for name, tensors in _safetensors_entries(path, keep):
            yield name, tensors.get_tensor(name)
        return
    # .bin or other formats: let transformers read them.
    from transformers import AutoModelForCausalLM

    logger.info("No safetensors in %s; loading the state dict through transformers", path)
    state = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).state_dict()
    yield from ((name, tensor) for name, tensor in state.items() if keep is None or keep(name))


def load_pretrained(
    path: str, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[CausalLM, Any]:
    """The engine's model built from a local transformers checkpoint directory, and its transformers config."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    model = CausalLM(ModelSpec.from_hf_config(config)).to(device=device, dtype=dtype)
    load_weights(model, read_checkpoint(path), strict=True)
    return model, config


def load_drafter_parts(
    path: str, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> CausalLM:
    """What an EAGLE drafter needs of its target, as a one-layer `CausalLM`: the embedding, the LM head, the final norm
    and rotary tables, and the target's last decoder layer (the drafter's starting layer,
    `EagleDrafterModel.from_target`) as layer 0. Only those tensors are read: a drafter worker holds about the
    embedding, the head and one layer, never the whole target (at 7B: 5 GB of fp32 instead of 30)."""
    from transformers import AutoConfig

    spec = ModelSpec.from_hf_config(AutoConfig.from_pretrained(path))
    last = f"model.layers.{spec.num_layers - 1}."

    def keep(name: str) -> bool:
        return not name.startswith("model.layers.") or name.startswith(last)

    part_spec = dataclasses.replace(spec, num_layers=1)
    # Shapes first, from the config and the safetensors headers, before gigabytes are allocated and read.
    with torch.device("meta"):
        expected = {name: tuple(view.shape) for name, view in CausalLM(part_spec).hf_weight_views().items()}
    for name, shape in header_shapes(path, keep).items():
        renamed = name.replace(last, "model.layers.0.", 1)
        if renamed in expected and shape != expected[renamed]:
            raise ValueError(
                f"{path}: weight {name!r} has shape {shape} in its safetensors header, but config.json describes "
                f"{expected[renamed]}: the config and the weights are of different models. Fix: point the model path "
                "at a checkpoint whose config.json came with its weights."
            )
    model = CausalLM(part_spec).to(device=device, dtype=dtype)
    renamed = ((name.replace(last, "model.layers.0.", 1), tensor) for name, tensor in read_checkpoint(path, keep))
    load_weights(model, renamed, strict=True)
    model.source_num_layers = spec.num_layers
    return model


def header_shapes(path: str, keep: Callable[[str], bool] | None = None) -> dict[str, tuple[int, ...]]:
    """Shape of every tensor `keep` accepts in a checkpoint's safetensors files, read from their headers only (no
    tensor data); empty for checkpoints in other formats."""
    return {name: tuple(tensors.get_slice(name).get_shape()) for name, tensors in _safetensors_entries(path, keep)}


def _safetensors_entries(path: str, keep: Callable[[str], bool] | None) -> Iterable[tuple[str, Any]]:
    """(name, its open safetensors file) for every tensor `keep` accepts in the checkpoint's safetensors files, in
    file order; the handle reads that tensor's header or data without loading the others."""
    from safetensors import safe_open

    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(file, framework="pt") as tensors:
            for name in tensors.keys():  # noqa: SIM118 - safe_open's handle is not iterable
                if keep is None or keep(name):
                    yield name, tensors


def load_weights(model: CausalLM, named_tensors: Iterable[tuple[str, torch.Tensor]], *, strict: bool) -> int:
    """Copy tensors into `model` by transformers parameter name; returns how many were loaded.

    strict=True (initial load) also requires every parameter to be present. Unknown names always raise:
    silently skipping them would leave the rollout on stale weights.
    """
    try:
        return _load(model, named_tensors, strict)
    finally:
        model.invalidate_weight_caches()  # also after an error: some tensors may already have been overwritten


def _load(model: CausalLM, named_tensors: Iterable[tuple[str, torch.Tensor]], strict: bool) -> int:
    params = model.hf_weight_views()
    loaded, unknown = set(), []
    with torch.no_grad():
        for name, tensor in named_tensors:
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            param = params.get(name)
            if param is None:
                unknown.append(name)
                continue
            if param.shape != tensor.shape:
                raise ValueError(
                    f"Weight {name!r} has shape {tuple(tensor.shape)}, engine expects {tuple(param.shape)}"
                )
            param.copy_(tensor.to(dtype=param.dtype, device=param.device))
            loaded.add(name)
    if unknown:
        raise ValueError(f"Unknown weight name(s) for a {model.spec.model_type} model: {unknown[:5]}")
    if strict:
        tied = {"lm_head.weight"} if model.spec.tie_word_embeddings else set()
        missing = sorted(set(params) - loaded - tied)
        if missing:
            raise ValueError(f"Checkpoint is missing weight(s): {missing[:5]}")
    return len(loaded)


def read_eos_token_ids(path: str, config) -> list[int]:
    """EOS ids from generation_config.json (what vLLM uses) and the model config."""
    ids: list[int] = []
    for source in (getattr(config, "eos_token_id", None), _generation_config_eos(path)):
        if source is None:
            continue
        ids.extend(source if isinstance(source, list) else [source])
    return sorted(set(int(i) for i in ids))


def _generation_config_eos(path: str):
    file = os.path.join(path, "generation_config.json")
    if not os.path.exists(file):
        return None
    with open(file) as f:
        return json.load(f).get("eos_token_id")
