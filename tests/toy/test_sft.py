"""The SFT toy target: training lowers the loss, checkpoints load everywhere, the cache is reused, and the CLI
prints the evaluation."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.toy.conftest import FAST_RECIPE, FAST_STEPS
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.toy import cache, evaluate, sft
from verl_tlt.toy.task import make_problems


def test_a_few_steps_lower_the_response_loss(checkpoint):
    info = sft.read_training_info(checkpoint)
    losses = [entry["loss"] for entry in info["losses"]]
    assert len(losses) == FAST_STEPS
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    assert info["num_steps"] == FAST_STEPS and info["version"] == sft.TOY_TARGET_VERSION
    assert info["tokens"] > 0 and info["tokens_per_s"] > 0


def test_batches_are_seeded_bucketed_and_within_the_token_budget(tokenizer):
    first = [next(sft.batch_stream(tokenizer, seed=3, recipe=FAST_RECIPE)) for _ in range(2)]
    assert first[0] == first[1]
    stream = sft.batch_stream(tokenizer, seed=3, recipe=FAST_RECIPE)
    for _ in range(20):
        batch = next(stream)
        assert len(batch) * max(len(e) for e in batch) <= FAST_RECIPE.max_batch_tokens


def test_labels_cover_the_response_and_eos_only(tokenizer):
    (example,) = sft.encode_examples(tokenizer, make_problems(1, seed=5))
    input_ids, labels = sft.collate([example], tokenizer.pad_token_id)
    prompt_len = len(example.prompt_ids)
    assert (labels[0, :prompt_len] == -100).all()
    assert labels[0, prompt_len:].tolist() == example.response_ids
    assert example.response_ids[-1] == tokenizer.eos_token_id
    # The prompt is what verl's RLHFDataset renders: the chat template with the generation prompt.
    rendered = sft.render_prompt(tokenizer, make_problems(1, seed=5)[0])
    assert input_ids[0, :prompt_len].tolist() == tokenizer.encode(rendered, add_special_tokens=False)


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    recipe = sft.SFTRecipe(warmup_steps=10, min_lr_ratio=0.1)
    factors = [sft.lr_factor(step, 100, recipe) for step in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))
    assert sft.lr_factor(100, 100, recipe) == pytest.approx(0.1)


def test_checkpoint_loads_in_transformers_and_the_rollout_engine_with_equal_outputs(checkpoint, tokenizer):
    assert AutoTokenizer.from_pretrained(checkpoint).encode("12 - 4", add_special_tokens=False) == tokenizer.encode(
        "12 - 4", add_special_tokens=False
    )
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    prompt = sft.prompt_ids(tokenizer, make_problems(1, seed=1))[0]
    engine = RolloutEngine.from_pretrained(str(checkpoint))
    (output,) = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8))
    with torch.no_grad():
        hf = model.generate(torch.tensor([prompt]), max_new_tokens=len(output.token_ids), do_sample=False)
    assert hf[0, len(prompt) :].tolist() == output.token_ids
    assert engine.eos_token_ids == {tokenizer.eos_token_id}


def test_training_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "stale.txt").write_text("x")
    with pytest.raises(FileExistsError, match="non-empty"):
        sft.train_toy_target(tmp_path, num_steps=1, recipe=FAST_RECIPE)


def test_cache_trains_once_then_reuses_the_checkpoint(tmp_path, monkeypatch, caplog):
    calls = []
    real_train = sft.train_toy_target

    def counting_train(*args, **kwargs):
        calls.append(kwargs["num_steps"])
        return real_train(*args, **kwargs)

    monkeypatch.setattr(sft, "train_toy_target", counting_train)
    first = sft.ensure_toy_target(tmp_path, seed=2, num_steps=2, recipe=FAST_RECIPE)
    weights = (first / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="verl_tlt.files"):  # the shared build-once helper logs it
        second = sft.ensure_toy_target(tmp_path, seed=2, num_steps=2, recipe=FAST_RECIPE)
    assert first == second == tmp_path / f"toy-target-v{sft.TOY_TARGET_VERSION}-seed2-steps2"
    assert calls == [2]
    assert (second / "model.safetensors").stat().st_mtime_ns == weights
    assert "Reusing the toy target" in caplog.text
    # Training happened in a temporary folder that was renamed into place: nothing else is left behind.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [first.name]


def test_cache_retrains_an_incomplete_checkpoint_and_honours_the_env_root(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    broken = tmp_path / sft.target_dir_name(seed=0, num_steps=1)
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    path = sft.ensure_toy_target(num_steps=1, recipe=FAST_RECIPE)
    assert path == broken and (path / sft.TRAINING_INFO_NAME).is_file()
    assert cache.default_cache_root() == tmp_path


def test_cli_eval_prints_the_table_and_writes_json(checkpoint, tmp_path, capsys):
    from verl_tlt.toy.cli import main

    out = tmp_path / "report.json"
    assert main(["eval", str(checkpoint), "--num-problems", "4", "--max-new-tokens", "8", "--json", str(out)]) == 0
    assert "greedy acc" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["num_problems"] == 4 and report["training"]["num_steps"] == FAST_STEPS


def test_quickstart_accepts_the_target_tokenizer_and_rejects_another(checkpoint, toy_world, tmp_path):
    from verl_tlt.quickstart.recipe import check_same_tokenizer

    check_same_tokenizer(toy_world.model_dir, checkpoint)
    other = tmp_path / "other"
    shutil.copytree(checkpoint, other)
    template = (other / "chat_template.jinja").read_text()
    (other / "chat_template.jinja").write_text(template.replace("<sep>", "<eos>"))
    with pytest.raises(RuntimeError, match="differs from the toy world"):
        check_same_tokenizer(toy_world.model_dir, other)


def test_a_non_default_shape_is_trained_into_its_own_cache_folder(tmp_path):
    import json

    path = sft.ensure_toy_target(tmp_path, seed=2, num_steps=1, recipe=FAST_RECIPE, shape="deep")
    assert path.name.endswith("-steps1-deep")
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 8
    assert json.loads((path / sft.TRAINING_INFO_NAME).read_text())["shape"] == "deep"
    with pytest.raises(ValueError, match="Unknown toy shape"):
        sft.ensure_toy_target(tmp_path, shape="wide")


def test_training_and_evaluation_report_progress(checkpoint, tokenizer, caplog):
    from verl_tlt.toy.model import build_tiny_model

    model = build_tiny_model(tokenizer, seed=0)
    with caplog.at_level(logging.INFO, logger="verl_tlt.progress"):
        sft.train_steps(model, tokenizer, num_steps=2, seed=0, recipe=FAST_RECIPE)
        evaluate.evaluate_toy_target(checkpoint, num_problems=3, seed=0, max_new_tokens=4)
    lines = [record.getMessage() for record in caplog.records if record.name == "verl_tlt.progress"]
    assert any(line.startswith("toy SFT: 2/2 steps") and ", loss " in line for line in lines), lines
    assert any(line.startswith("toy target eval, greedy answers: 3/3 answers") for line in lines), lines
    assert any(line.startswith("toy target eval, T=1 answers: 3/3 answers") for line in lines), lines
