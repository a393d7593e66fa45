"""Which drafter family a run trains (`tlt.drafter.family`), and building a drafter of it for a target or a state.

eagle: EAGLE-1/2 (`verl_tlt.drafter.model`): the target's final feature, the target's head over the draft slots.
eagle3: EAGLE-3 (`verl_tlt.drafter.eagle3_model`): three fused target layers, its own head over the draft slots.
Both share one interface, so the trainer, the unroll, the engine and the exchanges take either; only building one
needs to know which.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from verl_tlt.drafter.eagle3_model import Eagle3DrafterModel
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.modeling.model import CausalLM, ModelSpec

FAMILIES = ("eagle", "eagle3")
DrafterModel = EagleDrafterModel | Eagle3DrafterModel


def check_family(family: str, key: str = "tlt.drafter.family") -> str:
    if family not in FAMILIES:
        raise ValueError(f"{key}={family!r} is not one of {list(FAMILIES)}; e.g. {key}=eagle3")
    return family


def new_drafter(target: CausalLM, family: str = "eagle", *, draft_vocab_size: int = 0) -> DrafterModel:
    """The starting drafter of `family` for `target` (each family's `from_target`). EAGLE-3's own head holds
    `draft_vocab_size` rows (its draft vocabulary's capacity; 0 is refused: it has no other head)."""
    check_family(family)
    if family == "eagle":
        return EagleDrafterModel.from_target(target)
    if draft_vocab_size < 1:
        raise ValueError(
            "an EAGLE-3 drafter drafts over its own head of draft_vocab_size rows: set tlt.drafter.draft_vocab_size "
            "> 0, e.g. tlt.drafter.draft_vocab_size=8192"
        )
    return Eagle3DrafterModel.from_target(target, draft_capacity=draft_vocab_size)


def family_of_state(state: dict[str, torch.Tensor]) -> str:
    """The family a drafter state dict (`model.state_dict()`) belongs to."""
    return "eagle3" if "aux_layer_ids" in state else "eagle"


def model_for_state(state: dict[str, torch.Tensor], spec: ModelSpec) -> DrafterModel:
    """A drafter of the state's family and shape for a target of `spec`, with the state loaded (strict), not
    attached (e.g. to export it where no target is held)."""
    if family_of_state(state) == "eagle":
        model: DrafterModel = EagleDrafterModel(spec)
    else:
        aux = tuple(int(i) for i in state["aux_layer_ids"].tolist())
        model = Eagle3DrafterModel(spec, aux, int(state["lm_head"].shape[0]))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise ValueError(f"the drafter state does not fit a drafter of this target: {error}") from error
    return model


def drafter_for_state(state: dict[str, torch.Tensor], target: CausalLM) -> DrafterModel:
    """A drafter of the state's family and shape, attached to `target`, with the state loaded (strict)."""
    weight = target.lm_head.weight
    model = model_for_state(state, target.spec).to(device=weight.device, dtype=weight.dtype)
    model.attach(target)
    return model


def empty_like(model: DrafterModel) -> DrafterModel:
    """A drafter of `model`'s family and shape with unset weights, not attached (a frozen copy to load into)."""
    if isinstance(model, Eagle3DrafterModel):
        return Eagle3DrafterModel(model.spec, model.aux_layers, model.draft_capacity)
    return EagleDrafterModel(model.spec)


def load_drafter(path: str | os.PathLike, target: CausalLM) -> DrafterModel:
    """Read a drafter export of either family (told apart by its config.json), validated against `target`."""
    from verl_tlt.drafter.load import load_eagle, read_export_config
    from verl_tlt.drafter.load_eagle3 import is_eagle3_config, load_eagle3

    if is_eagle3_config(read_export_config(Path(path))):
        return load_eagle3(path, target)
    return load_eagle(path, target)


def export_drafter(
    model: DrafterModel, out_dir: str | os.PathLike, *, target_config: dict | None = None, metadata: dict | None = None
) -> Path:
    """Write `model` in the layout vLLM loads for its family (`method: eagle` or `eagle3`); returns the directory."""
    from verl_tlt.drafter.export import export_eagle
    from verl_tlt.drafter.export_eagle3 import export_eagle3

    write = export_eagle3 if isinstance(model, Eagle3DrafterModel) else export_eagle
    return write(model, out_dir, target_config=target_config, metadata=metadata)


def drafter_from_init(init: str, target: CausalLM, family: str = "eagle", *, draft_vocab_size: int = 0):
    """The drafter `tlt.drafter.init` names, attached to `target`: "target" (a new drafter of `family`) or an export,
    which must be of `family` (a run that asked for EAGLE-3 never silently trains an EAGLE-1 drafter, or back)."""
    if init == "target":
        return new_drafter(target, family, draft_vocab_size=draft_vocab_size)
    model = load_drafter(init, target)
    if model.family != family:
        raise ValueError(
            f"tlt.drafter.init={init} is an {model.family} drafter, but tlt.drafter.family={family}: set "
            f"tlt.drafter.family={model.family}, or point tlt.drafter.init at an {family} export (or 'target')"
        )
    return model


def feature_layers_for(family: str, init: str, target_num_layers: int) -> tuple[int, ...]:
    """The target layers a run's drafter reads besides the final one, known before any drafter is built (what the
    actor's capture hooks): none for EAGLE-1; EAGLE-3's, from the export `init` names or the target's defaults."""
    import json

    from verl_tlt.drafter.eagle3_model import check_aux_layers, default_aux_layers

    if check_family(family) == "eagle":
        return ()
    if init == "target":
        return default_aux_layers(target_num_layers)
    config = json.loads((Path(init) / "config.json").read_text())
    layers = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )
    if not layers:
        raise ValueError(f"{init}/config.json names no eagle_aux_hidden_state_layer_ids: not an EAGLE-3 export")
    check_aux_layers(tuple(layers), target_num_layers)
    return tuple(layers)


def feature_tokens(tokens: int, family: str, num_feature_layers: int, *, labelled: bool) -> int:
    """A token budget set for EAGLE-1 (one H-wide vector per token) turned into the same bytes for `family`: EAGLE-3
    keeps n layers per token once labelled, and n + 1 (the final state too) until then. At least 2 tokens."""
    if family == "eagle":
        return tokens
    widths = num_feature_layers + (0 if labelled else 1)
    return max(2, tokens // max(1, widths))
