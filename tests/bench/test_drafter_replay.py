"""drafter-replay: the TLT trainer's order (train, then score on fresh samples, then add), budgets, shared weights."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.bench.drafter_replay import replay
from verl_tlt.config import DrafterConfig
from verl_tlt.drafter.capture_record import RecordedStep
from verl_tlt.drafter.data import DrafterSample
from verl_tlt.drafter.export import export_eagle
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.modeling.model import sequence_hidden_states
from verl_tlt.modeling.weights import load_pretrained

CONFIG = DrafterConfig(lr=3e-3, max_tokens_per_batch=128)


@pytest.fixture(scope="module")
def world(varied_qwen2, tmp_path_factory):
    """(target path, drafter dir, samples of the target's own hidden states)."""
    path = varied_qwen2[0]
    target, _ = load_pretrained(str(path))
    drafter_dir = tmp_path_factory.mktemp("replay_drafter")
    export_eagle(EagleDrafterModel.from_target(target), drafter_dir)
    generator = torch.Generator().manual_seed(3)
    samples = []
    for length in (24, 20, 22, 18):
        ids = torch.randint(3, target.spec.vocab_size, (length,), generator=generator)
        samples.append(DrafterSample(ids, sequence_hidden_states(target, ids.tolist()), torch.arange(length) >= 4))
    return str(path), str(drafter_dir), samples


def steps_of(samples, count: int, shared=None) -> list[RecordedStep]:
    return [RecordedStep(step, list(samples), shared if step > 1 else None) for step in range(1, count + 1)]


def test_without_training_online_and_frozen_score_alike_and_step_one_is_never_trained(world):
    target, drafter, samples = world
    result = replay(steps_of(samples, 3), target, drafter, CONFIG, [0])
    assert [r["train_steps"] for r in result["rows"]] == [0, 0, 0]
    for row in result["rows"]:
        for metric in ("est_acceptance_length", "est_coupled_acceptance_length", "chain_acceptance_length"):
            assert row[f"online_{metric}"] == pytest.approx(row[f"frozen_{metric}"], abs=1e-9)
    trained = replay(steps_of(samples, 3), target, drafter, CONFIG, [5])
    assert [r["train_steps"] for r in trained["rows"]] == [0, 5, 5]  # nothing to train on before step 1's capture


def test_training_on_the_recorded_data_beats_the_frozen_drafter(world):
    target, drafter, samples = world
    result = replay(steps_of(samples, 4), target, drafter, CONFIG, [0, 20, 20, 20])
    assert result["train_steps"] == 60
    assert result["last3"]["est_acceptance_length"]["ratio"] > 1.05
    assert result["last3"]["chain_acceptance_length"]["ratio"] > 1.05
    # What each rollout decoded with is the drafter from before that step's burst: at step 2 the initial one.
    second = result["rows"][1]
    assert second["rollout_chain_acceptance_length"] == pytest.approx(second["frozen_chain_acceptance_length"])
    assert result["last3"]["chain_acceptance_length"]["rollout_ratio"] > 1.0
    first = result["rows"][0]
    assert first["online_top1_accuracy"] == pytest.approx(first["frozen_top1_accuracy"])


def test_each_step_is_scored_under_the_policy_weights_its_rollout_used(world):
    target, drafter, samples = world
    model, _ = load_pretrained(target)
    name = "model.embed_tokens.weight"
    moved = {name: model.hf_weight_views()[name] * -1.0}
    same = replay(steps_of(samples, 2), target, drafter, CONFIG, [0])["rows"]
    changed = replay(steps_of(samples, 2, moved), target, drafter, CONFIG, [0])["rows"]
    # step 1: the initial target
    assert changed[0]["frozen_top1_accuracy"] == pytest.approx(same[0]["frozen_top1_accuracy"])
    assert changed[1]["frozen_top1_accuracy"] != pytest.approx(same[1]["frozen_top1_accuracy"])


def test_a_budget_per_step_must_cover_every_step(world):
    target, drafter, samples = world
    with pytest.raises(ValueError, match="one per recorded step \\(3\\)"):
        replay(steps_of(samples, 3), target, drafter, CONFIG, [1, 2])


def test_the_cli_names_a_missing_recording_and_writes_json(world, tmp_path, capsys):
    from verl_tlt.bench.cli import main
    from verl_tlt.drafter.capture_record import save_step

    target, drafter, samples = world
    with pytest.raises(SystemExit):
        main(["drafter-replay", "--record", str(tmp_path / "none"), "--target", target, "--drafter", drafter])
    assert "record a run with tlt.drafter.record_dir=" in capsys.readouterr().err
    for record in steps_of(samples, 2):
        save_step(tmp_path / "rec", record)
    out = tmp_path / "replay.json"
    args = ["--record", str(tmp_path / "rec"), "--target", target, "--drafter", drafter, "--json", str(out)]
    main(["drafter-replay", *args, "--batch-tokens", "64", "--steps-per-rl-step", "0", "2", "--threads", "1"])
    import json

    result = json.loads(out.read_text())
    assert [r["train_steps"] for r in result["rows"]] == [0, 2]
    assert result["train_config"]["max_tokens_per_batch"] == 64


def test_the_replay_reports_each_recorded_step(world, caplog):
    import logging

    target, drafter, samples = world
    with caplog.at_level(logging.INFO, logger="verl_tlt.progress"):
        replay(steps_of(samples, 2), target, drafter, CONFIG, [1])
    lines = [record.getMessage() for record in caplog.records if record.name == "verl_tlt.progress"]
    assert lines[-1].startswith("bench drafter-replay: 2/2 recorded steps") and "step 2, 1 optimizer steps" in lines[-1]
