"""`verl-tlt quickstart` in the command tree: its parser, options and defaults."""

from __future__ import annotations

import argparse

import pytest

from verl_tlt.quickstart import cli
from verl_tlt.quickstart.recipe import RUNS, settings_for


def _tree() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-tlt")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_register_adds_quickstart_with_every_run_including_the_control_by_default():
    args = _tree().parse_args(["quickstart"])
    assert args.func is cli.run
    assert args.runs is None and cli.default_runs(args.rollout) == list(RUNS) and "baseline_repeat" in RUNS
    assert cli.default_runs("vllm") == [name for name in RUNS if name != "tlt_group"]  # group drafts: torch only
    assert (args.model, args.replicas, args.out) == ("toy", 2, "outputs/quickstart")
    assert args.steps is None and settings_for(args.model).steps == 15  # unset sizes are the model's defaults


def test_a_real_model_gets_its_own_sizes_unless_given():
    toy, real = settings_for("toy"), settings_for("smollm2-135m")
    assert real.steps < toy.steps and real.batch_size * real.group_size < toy.batch_size * toy.group_size
    args = _tree().parse_args(["quickstart", "--model", "smollm2-135m", "--steps", "2"])
    assert (args.model, args.steps, args.batch_size) == ("smollm2-135m", 2, None)


def test_an_unknown_model_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--model", "gpt-9", "--out", str(tmp_path)])
    assert "--model must be toy or one of" in capsys.readouterr().err


def test_group_drafts_on_vllm_are_refused(tmp_path, capsys, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # as if vLLM were installed
    with pytest.raises(SystemExit):
        cli.main(["--rollout", "vllm", "--runs", "tlt_group", "--out", str(tmp_path)])
    assert "group drafts run on the torch rollout only" in capsys.readouterr().err


def test_options_reach_the_parsed_arguments():
    args = _tree().parse_args(["quickstart", "--steps", "3", "--runs", "baseline", "tlt", "--override", "a=1", "b=2"])
    assert args.steps == 3 and args.runs == ["baseline", "tlt"] and args.override == ["a=1", "b=2"]


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--runs", "fast"]])
def test_bad_options_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit):
        _tree().parse_args(["quickstart", *argv])
    assert "quickstart" in capsys.readouterr().err


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert all(option in out for option in ("--steps", "--runs", "--override", "--cache", "--timeout"))


def _summary_with_identity(claims: dict) -> dict:
    return {"runs": {"tlt": []}, "identity": claims, "stage_s": {"verl run: tlt": 1.0}}


@pytest.mark.parametrize(("violations", "exit_code"), [([], 0), ([3], 1)])
def test_the_quickstart_fails_when_equal_weights_gave_different_responses(
    violations, exit_code, tmp_path, monkeypatch, capsys
):
    from verl_tlt.quickstart import runner
    from verl_tlt.quickstart.identity import identity_claim

    steps = [{"step": s, "weights_equal": True, "responses_equal": s not in violations} for s in (1, 2, 3)]
    summary = _summary_with_identity({"tlt": identity_claim(steps)})
    monkeypatch.setattr(runner, "run_comparison", lambda *args, **kwargs: summary)
    code = cli.main(["--out", str(tmp_path), "--cache", str(tmp_path / "cache"), "--runs", "tlt", "--no-plot"])
    assert code == exit_code
    assert ("IDENTITY VIOLATED" in capsys.readouterr().out) is bool(violations)
    assert (tmp_path / "summary.json").is_file()


def test_a_real_models_inputs_carry_its_tlt_settings_into_every_run(tmp_path, monkeypatch):
    """The model, its tasks and its drafter come from their builders; its TLT overrides reach the runs' overrides."""
    import contextlib

    import verl_tlt.models.prepare as prepare
    import verl_tlt.tasks.dataset as dataset
    import verl_tlt.tasks.drafter as task_drafter
    from verl_tlt.quickstart.real_model import prepare_real_model
    from verl_tlt.quickstart.recipe import REAL_MODEL_TLT_OVERRIDES, quickstart_overrides

    monkeypatch.setattr(prepare, "ensure_model", lambda model, cache=None: tmp_path / "model")
    files = {"train": tmp_path / "t.parquet", "val": tmp_path / "v.parquet", "max_prompt_length": 99}
    monkeypatch.setattr(dataset, "grpo_task_files", lambda actor, out, rows: files)
    monkeypatch.setattr(task_drafter, "ensure_task_drafter", lambda model, cache=None: tmp_path / "drafter")

    class Timer:
        def stage(self, name):
            return contextlib.nullcontext()

    settings = settings_for("smollm2-135m")
    inputs = prepare_real_model("smollm2-135m", tmp_path, tmp_path / "data", settings, Timer())
    assert (inputs.actor, inputs.drafter, inputs.max_prompt_length) == (tmp_path / "model", tmp_path / "drafter", 99)
    overrides = quickstart_overrides(inputs, settings)
    assert REAL_MODEL_TLT_OVERRIDES == []  # the user's defaults: no tlt key of its own
    assert not [o for o in overrides if o.startswith("tlt.drafter.eval")]
    assert f"tlt.drafter.init={tmp_path / 'drafter'}" in overrides


def test_eagle3_runs_on_the_toy_and_a_real_model_is_told_how_to_bring_its_own(tmp_path, capsys):
    assert _tree().parse_args(["quickstart", "--family", "eagle3"]).family == "eagle3"
    assert _tree().parse_args(["quickstart"]).family == "eagle"
    with pytest.raises(SystemExit):
        cli.main(["--family", "eagle3", "--model", "smollm2-135m", "--out", str(tmp_path)])
    assert "tlt.drafter.family=eagle3 tlt.drafter.init=" in capsys.readouterr().err


def test_the_toy_inputs_name_the_family_and_its_drafter(tmp_path, monkeypatch):
    """prepare_toy warms up (or reuses) the drafter of the asked family and every TLT run trains that family."""
    import contextlib

    import verl_tlt.toy.build as build
    import verl_tlt.toy.drafter as toy_drafter
    import verl_tlt.toy.sft as sft
    from verl_tlt.quickstart import runner
    from verl_tlt.quickstart.recipe import quickstart_overrides

    asked = {}
    world = argparse.Namespace(root=tmp_path, model_dir=tmp_path, train_parquet="t", val_parquet="v", reward_fn="r")
    monkeypatch.setattr(build, "build_toy_world", lambda root: world)
    monkeypatch.setattr(sft, "ensure_toy_target", lambda cache, compact_share: tmp_path / "target")
    monkeypatch.setattr(runner, "check_same_tokenizer", lambda a, b: None)
    monkeypatch.setattr(
        toy_drafter, "ensure_toy_drafter", lambda cache, compact_share, family: asked.setdefault("family", family)
    )

    class Timer:
        def stage(self, name):
            return contextlib.nullcontext()

    inputs = runner.prepare_toy(tmp_path, Timer(), "eagle3")
    assert asked == {"family": "eagle3"}
    assert "tlt.drafter.family=eagle3" in quickstart_overrides(inputs, settings_for("toy"))


def test_drafter_target_builds_no_drafter_and_starts_tlt_from_the_target(monkeypatch, tmp_path):
    """--drafter target: what a user gets without a warm-up; no drafter stage runs."""
    import contextlib

    import verl_tlt.models.prepare as prepare
    import verl_tlt.tasks.dataset as dataset
    import verl_tlt.tasks.drafter as task_drafter
    from verl_tlt.quickstart.real_model import prepare_real_model
    from verl_tlt.quickstart.recipe import quickstart_overrides

    monkeypatch.setattr(prepare, "ensure_model", lambda model, cache=None: tmp_path / "model")
    files = {"train": tmp_path / "t.parquet", "val": tmp_path / "v.parquet", "max_prompt_length": 99}
    monkeypatch.setattr(dataset, "grpo_task_files", lambda actor, out, rows: files)
    monkeypatch.setattr(task_drafter, "ensure_task_drafter", lambda *a, **k: pytest.fail("warmed up a drafter"))
    stages = []

    class Timer:
        def stage(self, name):
            stages.append(name)
            return contextlib.nullcontext()

    settings = settings_for("smollm2-135m")
    inputs = prepare_real_model("smollm2-135m", tmp_path, tmp_path / "data", settings, Timer(), warm_drafter=False)
    assert "drafter" not in stages and "tlt.drafter.init=target" in quickstart_overrides(inputs, settings)
    assert _tree().parse_args(["quickstart", "--drafter", "target"]).drafter == "target"
    assert _tree().parse_args(["quickstart"]).drafter == "warmup"


def test_a_relative_out_reaches_the_runs_absolute(monkeypatch, tmp_path):
    """verl runs in each run's own folder, so a relative --out (the default) must not reach it relative: the real
    model's task files live under it."""
    import verl_tlt.quickstart.runner as runner

    seen = {}

    def stop_here(cache, out, **kwargs):
        seen["out"] = out
        raise SystemExit(0)

    monkeypatch.setattr(runner, "run_comparison", stop_here)
    monkeypatch.chdir(tmp_path)
    args = _tree().parse_args(["quickstart", "--out", "outputs/qs", "--no-plot"])
    with pytest.raises(SystemExit):
        cli.run(args)
    assert seen["out"] == tmp_path / "outputs" / "qs" and seen["out"].is_absolute()
