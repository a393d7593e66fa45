"""Tiny target models shared with the engine tests, and drafters exported for them (export and load tests)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.engine.conftest import build_tiny_model, tiny_qwen2, varied_qwen2  # noqa: F401
from verl_tlt.drafter import EagleDrafterModel, export_eagle
from verl_tlt.engine import RolloutEngine
from verl_tlt.modeling.model import CausalLM

ARCHS = ("qwen2", "qwen3", "llama")


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, tuple[RolloutEngine, dict]]:
    """One tiny engine per architecture, with its config.json as a dict."""
    out = {}
    for arch in ARCHS:
        path = tmp_path_factory.mktemp(f"target_{arch}")
        build_tiny_model(arch, path)
        out[arch] = (RolloutEngine.from_pretrained(str(path)), json.loads((path / "config.json").read_text()))
    return out


def trained_drafter(target: CausalLM, seed: int = 0) -> EagleDrafterModel:
    """A drafter whose every tensor (fc, biases, norms) is moved off its initialisation, as training would."""
    torch.manual_seed(seed)
    drafter = EagleDrafterModel.from_target(target)
    with torch.no_grad():
        for param in drafter.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return drafter


@pytest.fixture()
def exported(targets, tmp_path):
    """(path, target model) of a fresh qwen2 export, for the bad-input tests to damage."""
    engine, config = targets["qwen2"]
    path = export_eagle(trained_drafter(engine.model), tmp_path / "eagle", target_config=config)
    return path, engine.model
