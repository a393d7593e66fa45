"""The real SmolLM2-135M-Instruct, prepared once into the test cache and loaded once per session."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch


class RealModel(NamedTuple):
    path: object  # the prepared Hugging Face folder
    tokenizer: object
    model: torch.nn.Module  # transformers' own model, fp32, for references


@pytest.fixture(scope="session")
def smollm2_model() -> RealModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_tlt.models.prepare import ensure_model

    path = ensure_model("smollm2-135m")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return RealModel(path, AutoTokenizer.from_pretrained(path), model)
