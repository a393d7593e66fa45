"""The drafter a vLLM replica starts with, built from the target's drafter parts alone (never a whole second copy)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from verl_tlt.drafter import initial
from verl_tlt.drafter.export import WEIGHTS_FILE, export_eagle
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.modeling.weights import load_pretrained


def test_the_target_init_exports_what_the_whole_target_would_from_one_layer(varied_qwen2, tmp_path, monkeypatch):
    path, _ = varied_qwen2
    full, _ = load_pretrained(str(path))
    assert len(full.model.layers) > 1
    reference = export_eagle(EagleDrafterModel.from_target(full), tmp_path / "reference")
    held = []
    parts = initial.load_drafter_parts

    def recorded(*args, **kwargs):
        held.append(parts(*args, **kwargs))
        return held[-1]

    monkeypatch.setattr(initial, "load_drafter_parts", recorded)
    built = initial.initial_drafter_export("target", str(path), tmp_path / "initial")
    assert [len(target.model.layers) for target in held] == [1]  # the server held one layer, not the target
    got, want = load_file(str(built / WEIGHTS_FILE)), load_file(str(reference / WEIGHTS_FILE))
    assert set(got) == set(want) and all(torch.equal(got[name], want[name]) for name in want)
    assert initial.initial_drafter_export(str(built), str(path), tmp_path / "unused") == built  # validated, kept
