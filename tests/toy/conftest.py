"""Shared fixtures for the toy-world tests: one tokenizer, one small built world and one briefly trained target."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_tlt.toy import sft
from verl_tlt.toy.build import ToyWorld, build_toy_world
from verl_tlt.toy.tokenizer import build_tokenizer

# Tiny batches and a short warm-up: a handful of steps then takes about a second and still moves the loss.
FAST_RECIPE = sft.SFTRecipe(warmup_steps=2, max_batch_tokens=1024, pool_size=64)
FAST_STEPS = 12


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def toy_world(tmp_path_factory: pytest.TempPathFactory) -> ToyWorld:
    return build_toy_world(tmp_path_factory.mktemp("toy_world"), seed=0, num_train=32, num_val=8)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sft") / "target"
    return sft.train_toy_target(out, seed=0, num_steps=FAST_STEPS, recipe=FAST_RECIPE, log_every=1)
