"""Shared pytest setup: caches outside the home directory, and gpu/vllm markers that skip cleanly where their
hardware/packages are missing."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import pytest

from verl_tlt.toy.cache import CACHE_ENV

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

# Tests never write to the user's home. Every cache they fill (the trained toy target and drafters, Hugging Face
# datasets and remote-code modules that verl jobs load, matplotlib's font list, Triton kernels) goes to one folder
# under the system temporary directory, shared by all sessions of this user so that a re-run does not retrain the
# toy target. Set here, at import, so the subprocesses tests start (verl jobs, CLI runs) inherit it.
TEST_CACHE_ROOT = Path(tempfile.gettempdir()) / f"verl-tlt-tests-{os.getuid()}"
os.environ[CACHE_ENV] = str(TEST_CACHE_ROOT / "verl-tlt")
os.environ["XDG_CACHE_HOME"] = str(TEST_CACHE_ROOT / "xdg")
os.environ["HF_HOME"] = str(TEST_CACHE_ROOT / "xdg" / "huggingface")
os.environ["MPLCONFIGDIR"] = str(TEST_CACHE_ROOT / "matplotlib")
os.environ["TRITON_CACHE_DIR"] = str(TEST_CACHE_ROOT / "triton")


def pytest_collection_modifyitems(config, items):
    import torch

    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_vllm = pytest.mark.skip(reason="needs vLLM installed")
    has_vllm = importlib.util.find_spec("vllm") is not None
    for item in items:
        # Markers, not keywords: a test under tests/integrations/vllm has "vllm" among its keywords (its path).
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if item.get_closest_marker("vllm") and not has_vllm:
            item.add_marker(skip_vllm)
