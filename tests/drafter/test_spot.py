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


@pytest.mark.parametrize("min_steps", [0, 1])
def test_a_burst_stopped_before_its_first_step_takes_min_steps(spot, min_steps):
    """The stop comes before the burst's loop ran at all (as when the rollout ends just after a start): by default
    the burst ends without a step, so the rollout's end never waits for one (seconds on a real model); with
    min_steps=1 (the e2e tests' min_burst_steps) it takes exactly one."""
    trainer, engine = spot
    trainer.add_samples(samples(engine))
    onload = trainer.trainer.to_device

    def onload_then_told_to_stop(device):  # the burst's thread, before its loop's first check
        onload(device)
        trainer.stop_event.set()

    trainer.trainer.to_device = onload_then_told_to_stop
    assert trainer.start(min_steps=min_steps)
    report = trainer.stop()
    assert report.stopped_by == "stop" and report.steps == min_steps and trainer.version == min_steps


def test_a_stop_request_returns_during_a_step_which_then_finishes_and_is_published(spot):
    """request_stop answers while an optimizer step is still running (a CPU worker's rollout end must not wait for
    it); the step completes, the burst takes no further one, and stop() publishes it."""
    import threading

    trainer, engine = spot
    trainer.add_samples(samples(engine))
    in_step, release = threading.Event(), threading.Event()
    step = trainer.trainer.train_step

    def held_step(batch):
        in_step.set()
        assert release.wait(60), "hang guard: the test never released the step"
        return step(batch)

    trainer.trainer.train_step = held_step
    assert trainer.request_stop() is False  # nothing running
    assert trainer.start()
    assert in_step.wait(60)
    assert trainer.request_stop() is True and trainer.is_running  # answered with the step still in progress
    assert trainer.burst_progress()[0] == 0 and trainer.version == 0
    release.set()
    report = trainer.stop()
    assert report.stopped_by == "stop" and report.steps == 1
    assert trainer.version == 1 and trainer.total_steps == 1 and trainer.trainer.global_step == 1


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


class FakeMemory:
    """A MemoryBudget whose resident size the test sets: `over` makes it exceeded for that many checks."""

    def __init__(self):
        self.limit, self.over = 100, 0

    def resident(self) -> int:
        if self.over > 0:
            self.over -= 1
            return 200
        return 50

    def exceeded(self) -> bool:
        return self.resident() > self.limit

    def describe(self) -> str:
        return "test"


def test_a_burst_over_its_memory_budget_ends_keeps_its_steps_and_frees_the_oldest_samples(varied_qwen2):
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]))
    memory = FakeMemory()
    trainer = SpotTrainer(
        EagleDrafterModel.from_target(engine.model), DrafterConfig(lr=1e-3, max_tokens_per_batch=64), memory=memory
    )
    trainer.add_samples(samples(engine, count=8))
    steps_taken = []
    original = trainer.trainer.train_step

    def step_then_grow(batch):
        steps_taken.append(1)
        if len(steps_taken) == 2:
            memory.over = 2  # the check before step 3 and the first check after the burst see the process over
        return original(batch)

    trainer.trainer.train_step = step_then_grow
    assert trainer.start(max_steps=10)
    deadline = time.monotonic() + 60
    while trainer.is_running and time.monotonic() < deadline:  # the burst ends by itself, over the budget
        time.sleep(0.01)
    report = trainer.stop(timeout=60)
    assert report.steps == 2 and trainer.version == 1  # the steps it made are published
    assert trainer.status()["memory_stops"] == 1 and trainer.status()["last_error"] is None
    assert len(trainer.trainer.buffer) == 6  # a quarter of the 8 samples dropped, then back under the budget
    memory.over = 10  # still over before the next burst: it does not start
    assert trainer.start(max_steps=1) is False and trainer.status()["memory_stops"] == 2
    assert len(trainer.trainer.buffer) == 0  # everything it could give back went


class DeviceMoves:
    """Stands in for the trainer's device moves on a CPU-only host: records where each burst puts the drafter."""

    def __init__(self, spot_trainer: SpotTrainer, monkeypatch):
        self.moves: list[str] = []
        self.freed = 0
        monkeypatch.setattr(spot_trainer.trainer, "to_device", lambda device: self.moves.append(str(device)))
        import verl_tlt.drafter.spot as spot_module

        def count_free():
            self.freed += 1

        monkeypatch.setattr(spot_module, "free_caches", count_free)


def _wait_for_a_step(spot_trainer: SpotTrainer) -> None:
    deadline = time.monotonic() + 60
    while spot_trainer.trainer.global_step == 0:
        assert time.monotonic() < deadline, "hang guard: no training step within 60 s"
        time.sleep(0.005)


@pytest.mark.parametrize("ending", ["stop", "no_data", "error", "out_of_memory"])
def test_every_burst_onloads_to_its_device_and_offloads_to_the_host_however_it_ends(varied_qwen2, monkeypatch, ending):
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]))
    spot_trainer = SpotTrainer(
        EagleDrafterModel.from_target(engine.model), DrafterConfig(lr=1e-3, max_tokens_per_batch=64), device="cuda:0"
    )
    assert spot_trainer.host == torch.device("cpu") and spot_trainer.device == torch.device("cuda:0")
    spot_trainer.add_samples(samples(engine))
    moves = DeviceMoves(spot_trainer, monkeypatch)
    if ending in ("error", "out_of_memory"):
        error = torch.OutOfMemoryError("CUDA out of memory (injected)") if ending == "out_of_memory" else ValueError()

        def fail(batch):
            raise error

        monkeypatch.setattr(spot_trainer.trainer, "train_step", fail)
    assert spot_trainer.start(max_steps=None if ending == "stop" else 10_000)
    if ending == "stop":
        _wait_for_a_step(spot_trainer)  # the stop lands inside the burst, between optimizer steps
    elif ending == "no_data":
        spot_trainer.trainer.buffer.next_batch = lambda tokens: None
    report = spot_trainer.stop(timeout=60)
    assert moves.moves == ["cuda:0", "cpu"] and moves.freed >= 1  # onload, then offload and the cache freed
    status = spot_trainer.status()
    assert status["device"] == "cuda:0" and status["onload_s"] >= 0 and status["offload_s"] >= 0
    if ending == "stop":
        assert report.stopped_by == "stop" and report.steps >= 1 and spot_trainer.version == 1
    if ending == "out_of_memory":  # ends the burst, counted; the worker stays usable
        assert report is None and status["memory_stops"] == 1 and "out of memory" in status["last_error"]
    if ending == "error":
        assert report is None and status["memory_stops"] == 0 and spot_trainer.version == 0


def test_the_trainer_moves_drafter_target_parts_and_moments_and_lists_what_is_off_a_device(spot):
    trainer, engine = spot
    trainer.add_samples(samples(engine))
    trainer.start(max_steps=1)
    trainer.stop(timeout=60)
    inner = trainer.trainer
    assert inner.optimizer.state and inner.tensors_off("cpu") == []
    assert len(inner.tensors_off("cuda")) >= len(list(inner.model.parameters())) + 2  # + embedding, head moments


@pytest.mark.gpu
def test_nothing_stays_on_the_gpu_after_a_burst(varied_qwen2):
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]))
    spot_trainer = SpotTrainer(
        EagleDrafterModel.from_target(engine.model), DrafterConfig(lr=1e-3, max_tokens_per_batch=64), device="cuda"
    )
    spot_trainer.add_samples(samples(engine))
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    assert spot_trainer.start(max_steps=3)
    report = spot_trainer.stop(timeout=120)
    assert report.steps == 3 and spot_trainer.trainer.tensors_off("cpu") == []
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == baseline  # no tensor of the burst left on the device
