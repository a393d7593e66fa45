"""Reading an EAGLE-3 export (`verl_tlt.drafter.export_eagle3`, or another EAGLE-3 checkpoint in vLLM's layout) back,
validated against the target it attaches to.

The draft-vocabulary map is where EAGLE-3 checkpoints fail silently elsewhere: vLLM keeps zeros for a missing `d2t`
(slot s then drafts token s), and a map regenerated after training misaligns the trained rows. Here a missing map, one
whose length differs from the head's, or one naming tokens outside the vocabulary or twice, is an error naming the
file and the fix. So are layer ids the target does not have and every tensor that is missing, unknown or misshapen.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from verl_tlt.drafter.eagle3_model import Eagle3DrafterModel, check_aux_layers
from verl_tlt.drafter.export import CONFIG_FILE, WEIGHTS_FILE
from verl_tlt.drafter.export_eagle3 import eagle3_views
from verl_tlt.drafter.load import (
    check_shared_tensors,
    copy_checked,
    drafter_layer_spec,
    read_export_config,
    read_export_tensors,
)
from verl_tlt.modeling.model import CausalLM

# Tensors other EAGLE-3 trainers write that this drafter does not use (checked where they can disagree).
_IGNORED = {"t2d"}


def is_eagle3_config(config: dict) -> bool:
    """Whether a drafter config.json describes an EAGLE-3 drafter (ours, or another trainer's in vLLM's layout)."""
    block = config.get("verl_tlt")
    if isinstance(block, dict) and "format" in block:
        return block["format"] == "eagle3"
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    architectures = config.get("architectures") or []
    return (
        "draft_vocab_size" in config
        or "eagle_aux_hidden_state_layer_ids" in config
        or "eagle_aux_hidden_state_layer_ids" in eagle
        or any("Eagle3" in str(name) for name in architectures)
    )


def load_eagle3(path: str | os.PathLike, target: CausalLM) -> Eagle3DrafterModel:
    """Read an EAGLE-3 export as an `Eagle3DrafterModel` attached to `target`; ValueError naming the path and what
    is wrong for anything that would otherwise become a silently wrong drafter."""
    path = Path(path)
    config = read_export_config(path)
    spec = drafter_layer_spec(config, target.spec, path)
    if spec.attention_bias or spec.output_bias:
        raise ValueError(
            f"{path / CONFIG_FILE}: attention biases are on (attention_bias/qkv_bias); an EAGLE-3 drafter's layer here "
            "has none, as in vLLM's Llama EAGLE-3 layer for this export"
        )
    layers = _aux_layers(config, target, path)
    tensors = read_export_tensors(path)
    head, offsets = _head_and_map(config, tensors, target.spec.vocab_size, path)
    block = config.get("verl_tlt") if isinstance(config.get("verl_tlt"), dict) else {}
    slots = head.shape[0]
    chosen = int(block.get("chosen_vocab_size", slots))  # another trainer's map: every slot chosen
    capacity = int(block.get("draft_vocab_capacity", slots))
    if not 0 <= chosen <= slots or capacity < chosen:
        raise ValueError(
            f"{path / CONFIG_FILE}: verl_tlt.chosen_vocab_size {chosen} must be in [0, {slots}] (the head's rows) and "
            f"draft_vocab_capacity {capacity} at least that"
        )
    param = target.lm_head.weight
    drafter = Eagle3DrafterModel(spec, layers, slots).to(device=param.device, dtype=param.dtype)
    drafter.attach(target)
    _copy_layer(drafter, tensors, target, path)
    ids = offsets + torch.arange(offsets.numel())
    state = {
        "draft_vocab_ids": ids,
        "chosen_vocab_size": torch.tensor(chosen),
        "draft_vocab_capacity": torch.tensor(capacity),
        "lm_head": head,
    }
    drafter.load_state_dict({**drafter.state_dict(), **state})
    return drafter


def _aux_layers(config: dict, target: CausalLM, path: Path) -> tuple[int, ...]:
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    layers = config.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    if not (isinstance(layers, list) and layers and all(isinstance(i, int) for i in layers)):
        raise ValueError(
            f"{path / CONFIG_FILE} names no target layers (eagle_aux_hidden_state_layer_ids, a list of layer ids); an "
            "EAGLE-3 drafter trained on other layers would draft from the wrong features. Re-export it with them."
        )
    try:
        check_aux_layers(tuple(layers), target.source_num_layers)
    except ValueError as error:
        raise ValueError(f"{path / CONFIG_FILE}: {error}") from error
    return tuple(layers)


def _head_and_map(config: dict, tensors: dict, vocab_size: int, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(lm_head [Vd, H], d2t [Vd]) after checking that they exist and agree with each other and the config."""
    file = path / WEIGHTS_FILE
    head, offsets = tensors.get("lm_head.weight"), tensors.get("d2t")
    if head is None:
        raise ValueError(f"{file} has no lm_head.weight: an EAGLE-3 drafter drafts with its own head")
    if offsets is None:
        raise ValueError(
            f"{file} has no d2t (the draft-vocabulary map): without it vLLM would take slot s for token s, silently. "
            "Re-export the drafter with its map (export_eagle3 always writes one)."
        )
    if offsets.dim() != 1 or offsets.is_floating_point() or offsets.shape[0] != head.shape[0]:
        raise ValueError(
            f"{file}: d2t must be an integer vector with one entry per head row ({head.shape[0]}), found "
            f"{offsets.dtype} {tuple(offsets.shape)}"
        )
    declared = config.get("draft_vocab_size", head.shape[0])
    if declared != head.shape[0]:
        raise ValueError(
            f"{path / CONFIG_FILE}: draft_vocab_size {declared} differs from the {head.shape[0]} rows of lm_head.weight"
        )
    ids = offsets.long() + torch.arange(offsets.numel())
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size or torch.unique(ids).numel() != ids.numel():
        raise ValueError(
            f"{file}: d2t maps the draft slots to token ids {int(ids.min())}..{int(ids.max())}, which must be distinct "
            f"and in [0, {vocab_size}); the map does not belong to this head or this target"
        )
    mask = tensors.get("t2d")
    if mask is not None:
        expected = torch.zeros(vocab_size, dtype=torch.bool)
        expected[ids] = True
        if mask.shape != expected.shape or not torch.equal(mask.bool(), expected):
            raise ValueError(f"{file}: t2d disagrees with d2t (they must mark the same tokens); re-export the drafter")
    return head, offsets.long()


def _copy_layer(drafter: Eagle3DrafterModel, tensors: dict, target: CausalLM, path: Path) -> None:
    own = {"lm_head.weight", "d2t"} | _IGNORED  # the head is EAGLE-3's own, never the target's shared one
    layer = {k: v for k, v in tensors.items() if k not in own}
    shared = check_shared_tensors(layer, target, path)
    hint = "(plus lm_head.weight and d2t; norm_before_fc / fc_norm variants are not supported.)"
    copy_checked(eagle3_views(drafter), {k: v for k, v in layer.items() if k not in shared}, path, "EAGLE-3", hint)
