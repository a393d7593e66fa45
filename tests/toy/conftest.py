"""Shared fixtures for the toy-world tests: one tokenizer and one small built world per session."""

from __future__ import annotations

import pytest

from verl_tlt.toy.build import ToyWorld, build_toy_world
from verl_tlt.toy.tokenizer import build_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def toy_world(tmp_path_factory: pytest.TempPathFactory) -> ToyWorld:
    return build_toy_world(tmp_path_factory.mktemp("toy_world"), seed=0, num_train=32, num_val=8)
