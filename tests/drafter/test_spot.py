"""Spot training: background start/stop within a step, versions, failures that never escape."""

from __future__ import annotations

import time

import pytest
import torch

from verl_tlt.config import DrafterConfig
from verl_tlt.drafter.checkpoint import CHECKPOINT_KIND
from verl_tlt.drafter.data import DrafterSample
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.drafter.safe_state import load_state
from verl_tlt.drafter.spot import SpotTrainer
from verl_tlt.engine import RolloutEngine
from verl_tlt.modeling.model import sequence_hidden_states


@pytest.fixture()
def spot(varied_qwen2, tmp_path):
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]))
    torch.manual_seed(0)
    trainer = SpotTrainer(
        EagleDrafterModel.from_target(engine.model),
        DrafterConfig(lr=1e-3, max_tokens_per_batch=64),
        checkpoint_dir=tmp_path / "ckpt",
    )
    return trainer, engine


def samples(engine, count=4, length=24):
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        ids = torch.randint(3, engine.model.spec.vocab_size, (length,), generator=generator)
        hidden = sequence_hidden_states(engine.model, ids.tolist())
        out.append(DrafterSample(ids, hidden, torch.arange(length) >= 4))
    return out


def test_nothing_to_train_means_no_start(spot):
    trainer, _ = spot
    assert trainer.start() is False and trainer.stop() is None and trainer.version == 0


def test_start_then_stop_publishes_a_new_version_and_checkpoints(spot):
    trainer, engine = spot
    trainer.add_samples(samples(engine))
    before = trainer.weights()
    assert trainer.start() and trainer.start() is False  # already running
    deadline = time.monotonic() + 60
    while trainer.trainer.global_step == 0:  # stop only once a step was taken, however slow the machine
        assert time.monotonic() < deadline, "hang guard: no training step within 60 s"
        time.sleep(0.01)
    report = trainer.stop()
    assert report.stopped_by == "stop" and report.steps > 0
    assert trainer.version == 1 and trainer.status()["total_steps"] == report.steps
    after = trainer.weights()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    trainer.trainer.wait_for_save()
    assert load_state(trainer.checkpoint_dir / "latest", kind=CHECKPOINT_KIND)["global_step"] == report.steps


def test_samples_can_arrive_while_training_runs(spot):
    trainer, engine = spot
    trainer.add_samples(samples(engine, count=2))
    trainer.start()
    assert trainer.add_samples(samples(engine, count=2, length=30)) == 2
    trainer.stop()
    assert trainer.status()["buffer_samples"] == 4


def test_a_crashing_training_run_keeps_the_last_good_drafter(spot, monkeypatch):
    trainer, engine = spot
    trainer.add_samples(samples(engine))
    trainer.start(max_steps=2)
    trainer.stop()
    good = trainer.weights()

    def explode(batch):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(trainer.trainer, "train_step", explode)
    trainer.start()
    report = trainer.stop()
    assert report is None and trainer.version == 1 and "out of memory" in trainer.status()["last_error"]
    assert all(torch.equal(good[k], v) for k, v in trainer.trainer.model.state_dict().items())
    monkeypatch.undo()
    trainer.start(max_steps=1)
    trainer.stop()
    assert trainer.version == 2 and trainer.status()["last_error"] is None  # the worker recovers


def test_a_diverging_run_is_rolled_back(spot, monkeypatch):
    trainer, engine = spot
    trainer.add_samples(samples(engine))
    good = trainer.weights()
    original = trainer.trainer.train_step

    def diverge(batch):
        metrics = original(batch)
        with torch.no_grad():  # as a too-large step would: finite loss, weights blown up
            trainer.trainer.model.fc.weight.fill_(float("inf"))
        return metrics

    monkeypatch.setattr(trainer.trainer, "train_step", diverge)
    trainer.start(max_steps=2)
    trainer.stop()
    assert trainer.version == 0 and "non-finite" in trainer.status()["last_error"]
    assert all(torch.equal(good[k], v) for k, v in trainer.trainer.model.state_dict().items())
    assert not trainer.trainer.optimizer.state  # the burst's moments are dropped with its weights
    monkeypatch.undo()
    trainer.start(max_steps=2)
    trainer.stop()
    assert trainer.version == 1 and trainer.status()["last_error"] is None  # training goes on
    assert all(torch.isfinite(p).all() for p in trainer.trainer.model.parameters())


def test_training_runs_with_the_callers_thread_count(spot, monkeypatch):
    """The training thread sizes its OpenMP team like the thread that called start(), not the process default."""
    from tests.openmp_probe import openmp_max_threads_probe

    probe = openmp_max_threads_probe()
    trainer, engine = spot
    trainer.add_samples(samples(engine))
    seen = []
    real_train = trainer.trainer.train

    def recording_train(*args, **kwargs):
        seen.append(probe())
        return real_train(*args, **kwargs)

    monkeypatch.setattr(trainer.trainer, "train", recording_train)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer.start()
        trainer.stop()
    finally:
        torch.set_num_threads(previous)
    assert seen == [1]
