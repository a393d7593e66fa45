"""`verl-tlt drafter warmup` from a verl RL parquet, end to end on the (untrained) toy world model."""

from __future__ import annotations

import json

import pytest

from verl_tlt.cli import main
from verl_tlt.drafter.load import load_eagle
from verl_tlt.engine import RolloutEngine
from verl_tlt.toy.build import build_toy_world


def test_warmup_cli_reads_parquet_prompts_and_exports(tmp_path):
    world = build_toy_world(tmp_path / "world", seed=0, num_train=8, num_val=4)
    out, report_path = tmp_path / "drafter", tmp_path / "report.json"
    argv = ["drafter", "warmup", "--target", str(world.model_dir), "--prompts", str(world.train_parquet)]
    argv += ["--out", str(out), "--num-prompts", "4", "--steps", "3", "--max-tokens", "8"]
    argv += ["--temperature", "0", "1", "--json", str(report_path), "--train-depth", "2"]
    assert main(argv) == 0
    report = json.loads(report_path.read_text())
    assert report["num_prompts"] == 4 and report["num_samples"] == 8 and report["train_steps"] == 3
    engine = RolloutEngine.from_pretrained(str(world.model_dir))
    load_eagle(str(out), engine.model)  # the export loads against its target
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 1


def test_warmup_cli_refuses_a_bad_train_depth_before_any_work(tmp_path, capsys):
    argv = ["drafter", "warmup", "--target", str(tmp_path / "missing"), "--prompts", str(tmp_path / "missing.parquet")]
    with pytest.raises(SystemExit):
        main([*argv, "--out", str(tmp_path / "out"), "--train-depth", "-1"])
    assert "--train-depth -1" in capsys.readouterr().err


def test_warmup_on_cuda_without_a_gpu_is_refused_naming_the_flag(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["drafter", "warmup", "--target", str(tmp_path / "m"), "--prompts", str(tmp_path / "p.parquet")]
    with pytest.raises(SystemExit):
        main([*argv, "--out", str(tmp_path / "out"), "--device", "cuda"])
    assert "--device cuda: this torch sees no CUDA device" in capsys.readouterr().err


@pytest.mark.gpu
def test_warmup_on_cuda_answers_in_bf16_and_trains_a_drafter_that_loads(tmp_path):
    world = build_toy_world(tmp_path / "world", seed=0, num_train=8, num_val=4)
    out, report_path = tmp_path / "drafter", tmp_path / "report.json"
    argv = ["drafter", "warmup", "--target", str(world.model_dir), "--prompts", str(world.train_parquet)]
    argv += ["--out", str(out), "--num-prompts", "4", "--steps", "3", "--max-tokens", "8", "--device", "cuda"]
    assert main([*argv, "--json", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["train_steps"] == 3 and report["trained_tokens_per_s"] > 0
    load_eagle(str(out), RolloutEngine.from_pretrained(str(world.model_dir)).model)
