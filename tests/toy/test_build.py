"""build_toy_world: complete, idempotent, and loadable offline by stock transformers."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_tlt.toy.build import MANIFEST_NAME, TOY_WORLD_VERSION, build_toy_world
from verl_tlt.toy.model import build_tiny_model
from verl_tlt.toy.task import make_problems as sample_problems
from verl_tlt.toy.task import solution_text

SMALL_MODEL = {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64}


def _mtimes(world) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in world.root.rglob("*") if p.is_file()}


def test_build_writes_every_path_it_returns(toy_world):
    for path in (toy_world.model_dir, toy_world.train_parquet, toy_world.val_parquet, toy_world.reward_fn):
        assert path.is_absolute() and path.exists(), path
    assert len(pd.read_parquet(toy_world.train_parquet)) == 32
    assert len(pd.read_parquet(toy_world.val_parquet)) == 8
    manifest = json.loads((toy_world.root / MANIFEST_NAME).read_text())
    assert manifest["version"] == TOY_WORLD_VERSION and manifest["model_kwargs"]["hidden_size"] == 128


def test_second_build_with_the_same_arguments_rewrites_nothing(tmp_path, caplog):
    first = build_toy_world(tmp_path, num_train=8, num_val=4, model_kwargs=SMALL_MODEL)
    before = _mtimes(first)
    with caplog.at_level(logging.INFO, logger="verl_tlt.toy.build"):
        second = build_toy_world(tmp_path, num_train=8, num_val=4, model_kwargs=dict(SMALL_MODEL))
    assert second == first
    assert _mtimes(second) == before
    assert "Reusing toy world" in caplog.text


def test_build_with_different_arguments_rebuilds(tmp_path):
    build_toy_world(tmp_path, num_train=8, num_val=4, model_kwargs=SMALL_MODEL)
    world = build_toy_world(tmp_path, num_train=8, num_val=6, model_kwargs=SMALL_MODEL)
    assert len(pd.read_parquet(world.val_parquet)) == 6
    assert json.loads((world.root / MANIFEST_NAME).read_text())["num_val"] == 6


def test_build_without_a_manifest_is_treated_as_incomplete(tmp_path):
    world = build_toy_world(tmp_path, num_train=8, num_val=4, model_kwargs=SMALL_MODEL)
    (world.root / MANIFEST_NAME).unlink()
    (world.model_dir / "model.safetensors").write_bytes(b"truncated")
    build_toy_world(tmp_path, num_train=8, num_val=4, model_kwargs=SMALL_MODEL)
    assert (world.model_dir / "model.safetensors").stat().st_size > 1000


def test_train_and_val_problems_come_from_different_streams(toy_world):
    train = pd.read_parquet(toy_world.train_parquet)
    val = pd.read_parquet(toy_world.val_parquet)
    expected_train = [str(p.answer) for p in sample_problems(32, seed=0)]
    assert [row["ground_truth"] for row in train["reward_model"]] == expected_train
    assert [m[0]["content"] for m in val["prompt"]] != [m[0]["content"] for m in train["prompt"][:8]]


def test_build_rejects_unknown_model_kwargs_with_the_valid_names(tmp_path):
    with pytest.raises(TypeError, match="hidden_sise.*hidden_size"):
        build_toy_world(tmp_path, model_kwargs={"hidden_sise": 64})


def test_world_reloads_with_auto_classes_and_keeps_the_toy_tokenizer(toy_world, tokenizer):
    reloaded_tokenizer = AutoTokenizer.from_pretrained(toy_world.model_dir)
    text = solution_text(sample_problems(1, seed=9)[0])
    ids = reloaded_tokenizer.encode(text, add_special_tokens=False)
    # Without the auto_map, transformers 5 would load a byte-level Qwen2Tokenizer here and both checks fail.
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert reloaded_tokenizer.decode(ids) == text
    assert reloaded_tokenizer.chat_template == tokenizer.chat_template

    model = AutoModelForCausalLM.from_pretrained(toy_world.model_dir)
    fresh = build_tiny_model(tokenizer, seed=0)
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids).logits, fresh(input_ids).logits)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_world_tokenizer_reloads_with_trust_remote_code_in_a_fresh_offline_process(toy_world, tmp_path):
    # verl's reward loop loads the tokenizer with trust_remote_code=True, which imports tokenization_toy.py
    # from the model dir; HF_MODULES_CACHE keeps that copy out of the home directory.
    code = (
        "import sys\n"
        "from transformers import AutoTokenizer\n"
        "tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
        "ids = tokenizer.encode('12 - 4 = 8 ; # 8', add_special_tokens=False)\n"
        "print(type(tokenizer).__name__, ids, repr(tokenizer.decode(ids)))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "hf_modules")}
    result = subprocess.run(
        [sys.executable, "-c", code, str(toy_world.model_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ToyTokenizer [7, 8, 17, 10, 18, 14, 19, 20, 14] '12 - 4 = 8 ; # 8'")
