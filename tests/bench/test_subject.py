"""What `--model` names for the speculative-decoding benchmarks: the toy, or a real model with its task drafter."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_tlt.bench import subject as subject_module
from verl_tlt.bench.subject import TOY, BenchSubject, bench_subject, known_subjects


def test_the_toy_is_the_first_subject_and_every_real_model_follows():
    from verl_tlt.models.registry import REAL_MODELS

    assert known_subjects() == [TOY, *REAL_MODELS]


def test_an_unknown_model_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown model 'llama-7b'; known: toy, smollm2-135m"):
        bench_subject("llama-7b")


def test_a_toy_shape_with_a_real_model_is_refused():
    with pytest.raises(ValueError, match="--toy-shape 'deep' applies to --model toy only"):
        bench_subject("smollm2-135m", "deep")


def test_a_real_models_prompts_mix_the_tasks_and_come_in_the_number_asked(monkeypatch):
    asked = []

    def fake_task_prompts(model_path, per_task, seed):
        asked.append((model_path, per_task, seed))
        return [[task, i] for i in range(per_task) for task in range(3)]  # interleaved, like mixed_problems

    import verl_tlt.tasks.drafter as task_drafter

    monkeypatch.setattr(task_drafter, "task_prompts", fake_task_prompts)
    real = BenchSubject("smollm2-135m", Path("/models/smollm2"), Path("/drafters/smollm2"))
    prompts = real.prompts(7, seed=11)
    assert asked == [(Path("/models/smollm2"), 3, 11)]  # ceil(7 / 3 tasks) per task
    assert prompts == [[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1], [0, 2]]
    assert real.about() == {"model": "smollm2-135m", "target": "/models/smollm2", "drafter": "/drafters/smollm2"}


def test_the_toys_about_names_its_shape():
    toy = BenchSubject(TOY, Path("/t"), Path("/d"), "deep")
    assert toy.about()["toy_shape"] == "deep"


@pytest.mark.parametrize("command", [["sd", "curve"], ["sd", "drafts", "suffix"], ["sd", "vllm"], ["adaptive"]])
def test_every_sd_benchmark_takes_model(command, monkeypatch, capsys):
    from verl_tlt.cli import main

    with pytest.raises(SystemExit) as excinfo:
        main(["bench", *command, "--model", "gpt-9"])
    err = capsys.readouterr().err
    assert excinfo.value.code == 2
    if command == ["sd", "vllm"] and "needs vLLM" in err:
        return  # where vLLM is missing, that is said first
    assert "--model must be one of toy, smollm2-135m" in err


def test_the_toy_shape_is_refused_with_a_real_model_on_the_command_line(capsys):
    from verl_tlt.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "sd", "curve", "--model", "smollm2-135m", "--toy-shape", "deep"])
    assert "--toy-shape applies to --model toy only" in capsys.readouterr().err


def test_the_named_subject_reaches_the_benchmark(monkeypatch):
    from verl_tlt.bench import sd_bench
    from verl_tlt.cli import main

    made, calls = [], []
    sentinel = BenchSubject("smollm2-135m", Path("/m"), Path("/d"))
    monkeypatch.setattr(
        subject_module, "bench_subject", lambda model, shape, drafter: made.append((model, shape, drafter)) or sentinel
    )
    monkeypatch.setattr(sd_bench, "run", lambda *args, **kwargs: calls.append(args))
    assert main(["bench", "sd", "curve", "--model", "smollm2-135m"]) == 0
    assert made == [("smollm2-135m", "default", None)] and calls[0][6] is sentinel


def test_a_drafter_folder_replaces_the_cached_one(tmp_path, monkeypatch):
    import verl_tlt.toy.drafter as toy_drafter
    import verl_tlt.toy.sft as toy_sft

    monkeypatch.setattr(toy_sft, "ensure_toy_target", lambda shape: tmp_path / "target")
    monkeypatch.setattr(toy_drafter, "ensure_toy_drafter", lambda shape: pytest.fail("the cached drafter was built"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    assert bench_subject(TOY, drafter=str(tmp_path / "mine")).drafter == tmp_path / "mine"


def test_a_drafter_folder_without_an_export_is_refused(tmp_path, capsys):
    from verl_tlt.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "sd", "curve", "--drafter", str(tmp_path)])
    assert "is not an exported drafter (no config.json there)" in capsys.readouterr().err
