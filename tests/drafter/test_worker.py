"""Drafter worker: one drafter history across workers (handoff), versions, target sync, checkpoints, faults."""

from __future__ import annotations

import io
import time

import pytest
import torch

from verl_tlt.config import DrafterConfig
from verl_tlt.drafter import worker as worker_module
from verl_tlt.drafter.checkpoint import CHECKPOINT_KIND
from verl_tlt.drafter.data import DrafterSample
from verl_tlt.drafter.export import export_eagle
from verl_tlt.drafter.safe_state import load_state
from verl_tlt.drafter.trainer import drafter_forward
from verl_tlt.drafter.worker import FAULT_ENV, DrafterWorker
from verl_tlt.modeling.model import sequence_hidden_states

# Two 24-token samples per 64-token batch: successive steps see different samples, so the buffer cursor matters.
CONFIG = DrafterConfig(lr=1e-3, max_tokens_per_batch=64)


def make_worker(path, config: DrafterConfig = CONFIG, **kwargs) -> DrafterWorker:
    # num_threads=None: leave the test process's torch thread count alone.
    return DrafterWorker(str(path), config, num_threads=None, **kwargs)


@pytest.fixture(scope="module")
def samples(varied_qwen2) -> list[DrafterSample]:
    """Five samples of the target's own hidden states (prompt = first 4 tokens)."""
    target = make_worker(varied_qwen2[0]).target
    generator = torch.Generator().manual_seed(1)
    out = []
    for length in (24, 20, 24, 18, 22):
        ids = torch.randint(3, target.spec.vocab_size, (length,), generator=generator)
        out.append(DrafterSample(ids, sequence_hidden_states(target, ids.tolist()), torch.arange(length) >= 4))
    return out


@pytest.fixture()
def fed(varied_qwen2, samples):
    """A factory of workers that already hold the shared samples (added in the same order, as the pool does)."""

    def build(**kwargs) -> DrafterWorker:
        worker = make_worker(varied_qwen2[0], **kwargs)
        assert worker.add_samples(samples) == len(samples)
        return worker

    return build


def burst(worker: DrafterWorker, steps: int) -> dict:
    """A deterministic spot burst: exactly `steps` optimizer steps, then the worker's stop()."""
    assert worker.spot.start(max_steps=steps)
    deadline = time.monotonic() + 60
    while worker.spot.is_running:
        assert time.monotonic() < deadline, "hang guard: spot training did not reach max_steps within 60 s"
        time.sleep(0.002)
    status = worker.stop()
    assert status["burst_steps"] == steps and status["last_error"] is None
    return status


def transferred(value):
    """What a Ray call does to an argument: a serialised copy, sharing no tensor with the sender."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def model_state(worker: DrafterWorker) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in worker.spot.trainer.model.state_dict().items()}


def assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def assert_same_optimizer(a: DrafterWorker, b: DrafterWorker) -> None:
    sa, sb = a.spot.trainer.optimizer.state_dict(), b.spot.trainer.optimizer.state_dict()
    assert sa["state"].keys() == sb["state"].keys() and len(sa["state"]) > 0
    for param_id, state in sa["state"].items():
        for key, value in state.items():
            assert torch.equal(value, sb["state"][param_id][key]), (param_id, key)


def differs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


# ----- handoff ---------------------------------------------------------------------------------------------------


def test_handoff_continues_the_owners_history_exactly(fed):
    owner, successor, control = fed(), fed(), fed()
    burst(owner, 3)
    state = owner.training_state()
    assert "samples" not in state["buffer"]  # the successor already holds the samples
    assert state["version"] == 1 and state["total_steps"] == 3 and state["global_step"] == 3

    successor.load_training_state(transferred(state))
    assert successor.weights()[0] == 1 and successor.status()["total_steps"] == 3
    assert successor.spot.trainer.buffer.times_used == owner.spot.trainer.buffer.times_used

    # What k more steps on the owner give, the successor gives too: weights, optimizer, cursor, version.
    successor.spot.start(max_steps=2)  # started through the spot trainer, as the pool's start() would
    while successor.spot.is_running:
        time.sleep(0.002)
    successor.stop()
    burst(owner, 2)
    assert_same_tensors(model_state(owner), model_state(successor))
    assert_same_optimizer(owner, successor)
    assert successor.spot.trainer.global_step == owner.spot.trainer.global_step == 5
    assert successor.spot.trainer.buffer.times_used == owner.spot.trainer.buffer.times_used
    assert successor.weights()[0] == owner.weights()[0] == 2
    assert successor.status()["total_steps"] == owner.status()["total_steps"] == 5

    # Control: the same 2 steps without the handoff give a different drafter (the comparison can fail).
    burst(control, 2)
    assert differs(model_state(owner), model_state(control))


def test_handoff_then_trainer_train_matches_the_owner_training_itself(fed):
    owner, successor = fed(), fed()
    burst(owner, 2)
    successor.load_training_state(transferred(owner.training_state()))
    report_successor = successor.spot.trainer.train(max_steps=3)
    report_owner = owner.spot.trainer.train(max_steps=3)
    assert report_owner.steps == report_successor.steps == 3
    assert report_owner.last_metrics == report_successor.last_metrics
    assert_same_tensors(model_state(owner), model_state(successor))


# ----- versions and weights --------------------------------------------------------------------------------------


def test_weights_are_the_published_version_and_a_burst_with_steps_bumps_it(fed):
    worker = fed(rank=3)
    version, initial = worker.weights()
    assert version == 0
    assert_same_tensors(initial, model_state(worker))

    status = burst(worker, 2)
    assert status["rank"] == 3 and status["version"] == 1 and status["total_steps"] == 2
    assert status["running"] is False and status["burst_seconds"] > 0.0
    version, trained = worker.weights()
    assert version == 1 and differs(initial, trained)
    assert_same_tensors(trained, model_state(worker))

    # weights() is a copy: changing it does not touch the published drafter.
    trained["fc.weight"].add_(1.0)
    assert_same_tensors(worker.weights()[1], model_state(worker))


def test_a_burst_without_steps_keeps_the_version(fed, varied_qwen2):
    worker = fed()
    assert worker.spot.start(max_steps=0)
    while worker.spot.is_running:
        time.sleep(0.002)
    assert worker.stop()["burst_steps"] == 0 and worker.weights()[0] == 0

    empty = make_worker(varied_qwen2[0])
    assert empty.start() is False  # nothing to train on
    status = empty.stop()
    assert status["burst_steps"] == 0 and status["burst_seconds"] == 0.0 and empty.weights()[0] == 0


def test_load_weights_adopts_the_published_version_without_optimizer_state(fed):
    owner, fallback = fed(), fed()
    burst(owner, 2)
    burst(owner, 1)
    version, weights = owner.weights()
    assert version == 2

    fallback.load_weights(version, transferred(weights))
    assert fallback.weights()[0] == 2
    assert_same_tensors(fallback.weights()[1], weights)
    assert fallback.status()["total_steps"] == 0  # its own count: the owner's optimizer history is not carried
    assert len(fallback.spot.trainer.optimizer.state) == 0
    burst(fallback, 1)
    assert fallback.weights()[0] == 3


def test_update_target_weights_changes_the_drafters_logits_and_inputs(fed, samples):
    worker = fed()
    burst(worker, 1)  # the initial fc ignores the embedding half ([0 | I]); one step makes it matter
    drafter = worker.spot.trainer.model
    batch = worker.spot.trainer.buffer.next_batch(64)
    before_features = drafter_forward(drafter, batch, batch.input_hidden).detach()
    drafter_weights = model_state(worker)

    generator = torch.Generator().manual_seed(5)
    embedding = torch.randn(tuple(worker.target.lm_head.weight.shape), generator=generator)
    loaded = worker.update_target_weights({"model.embed_tokens.weight": embedding, "lm_head.weight": embedding})
    assert loaded == 2

    features = torch.randn(1, 3, drafter.spec.hidden_size, generator=generator)
    # Over the draft vocabulary (the tokens of the fed samples' responses) the drafter's logits are the new head's.
    logits, expected = drafter.logits(features), features @ embedding.T
    drafted = torch.isfinite(logits)
    assert drafted.any() and torch.allclose(logits[drafted], expected[drafted], atol=1e-5)
    after_features = drafter_forward(drafter, batch, batch.input_hidden).detach()
    assert not torch.allclose(before_features, after_features)  # the shared embedding feeds the drafter's fc
    # Only the frozen target parts changed: the drafter's own weights and version did not.
    assert_same_tensors(drafter_weights, model_state(worker))
    assert worker.weights()[0] == 1

    with pytest.raises(ValueError, match="Unknown weight name"):
        worker.update_target_weights({"model.no_such.weight": embedding})


# ----- checkpoints -----------------------------------------------------------------------------------------------


def test_save_and_load_restore_weights_optimizer_and_version(fed, tmp_path):
    owner, restored = fed(), fed()
    burst(owner, 3)
    assert owner.save(str(tmp_path / "ckpt")) == {"version": 1, "total_steps": 3}  # what the checkpoint holds
    assert owner.wait_for_save()
    saved = load_state(tmp_path / "ckpt", kind=CHECKPOINT_KIND)
    assert "samples" not in saved["buffer"] and saved["buffer"]["times_used"]

    restored.load(str(tmp_path / "ckpt"), version=1, total_steps=3)
    assert restored.weights()[0] == 1 and restored.status()["total_steps"] == 3
    assert_same_tensors(restored.weights()[1], owner.weights()[1])
    assert_same_optimizer(owner, restored)
    assert restored.spot.trainer.global_step == 3
    assert restored.spot.trainer.buffer.times_used == owner.spot.trainer.buffer.times_used

    burst(owner, 2)
    burst(restored, 2)
    assert_same_tensors(model_state(owner), model_state(restored))
    assert restored.weights()[0] == owner.weights()[0] == 2


def test_a_save_while_a_burst_runs_is_refused(fed, tmp_path):
    worker = fed()
    assert worker.spot.start()
    try:
        with pytest.raises(RuntimeError, match="save while spot training runs"):
            worker.save(str(tmp_path / "ckpt"))
    finally:
        worker.stop()


def stepped(samples: list[DrafterSample], step: int) -> list[DrafterSample]:
    return [DrafterSample(s.token_ids, s.hidden_states, s.response_mask, step=step) for s in samples]


def run_burst(worker: DrafterWorker, steps_wanted: int = 2) -> dict:
    """worker.start(), wait for `steps_wanted` optimizer steps (a score group runs after each), then worker.stop()."""
    wanted = worker.spot.trainer.global_step + steps_wanted
    assert worker.start()
    deadline = time.monotonic() + 60
    while worker.spot.trainer.global_step < wanted and worker.spot.is_running:
        assert time.monotonic() < deadline, "hang guard: no training step within 60 s"
        time.sleep(0.002)
    return worker.stop()


def test_receive_stores_now_and_the_next_burst_scores_after_its_first_step(varied_qwen2, samples):
    worker = make_worker(varied_qwen2[0])
    assert worker.receive(stepped(samples, 3)) == len(samples) and len(worker.spot.trainer.buffer) == len(samples)
    buffer = worker.spot.trainer.buffer
    assert len(buffer.held) == 2  # whole samples holding at most half of the step's positions: 2 of 5 here
    report = run_burst(worker)
    scores = report["scores"]
    assert scores["step"] == 3.0 and scores["samples"] == 2 and scores["seconds"] > 0
    # One group, scored after the burst's first step (it trains first: a short idle window still moves the drafter):
    # the online drafter had taken that step, the frozen one had not.
    assert scores["online_accept_prob"] != pytest.approx(scores["frozen_accept_prob"], abs=1e-6)
    assert report["burst_steps"] >= 2 and not buffer.held  # scored: they train from now on
    assert "scores" not in run_burst(worker)  # scored once: the next burst only trains


def test_a_step_of_one_sample_is_not_held_out_so_its_burst_trains(varied_qwen2, samples):
    """Holding a step's only sample would leave the burst nothing to train on (and the score runs after a step)."""
    worker = make_worker(varied_qwen2[0])
    worker.receive(stepped(samples[:1], 1))
    assert not worker.spot.trainer.buffer.held
    report = run_burst(worker, steps_wanted=1)
    assert report["burst_steps"] >= 1 and "scores" not in report


def test_the_score_mark_moves_with_the_training_state(varied_qwen2, samples):
    """The next owner does not score again what the last owner scored, and scores what is newer."""
    owner, other = make_worker(varied_qwen2[0]), make_worker(varied_qwen2[0])
    for worker in (owner, other):
        worker.receive(stepped(samples[:3], 1))
    assert run_burst(owner)["scores"]["step"] == 1.0
    other.load_training_state(transferred(owner.training_state()))
    assert "scores" not in run_burst(other)
    for worker in (owner, other):
        worker.receive(stepped(samples[3:], 2))
    assert run_burst(other)["scores"]["step"] == 2.0


def test_a_set_replaced_before_any_burst_scored_it_is_counted(varied_qwen2, samples):
    worker = make_worker(varied_qwen2[0])
    worker.receive(stepped(samples[:2], 1))
    held_first = set(worker.spot.trainer.buffer.held)
    worker.receive(stepped(samples[2:], 2))
    assert worker.status()["scores_skipped"] == 1
    assert held_first and not held_first & worker.spot.trainer.buffer.held  # released into training, unscored
    assert run_burst(worker)["scores"]["step"] == 2.0


def test_a_burst_held_in_its_score_still_stops_when_told(varied_qwen2, samples, tmp_path):
    """hold_score keeps step 2's score running until its file exists: the burst's stop ends it anyway."""
    release = tmp_path / "never_written"
    worker = make_worker(varied_qwen2[0], fault=f"hold_score=2:{release},min_burst_steps=1")
    worker.receive(stepped(samples, 2))
    assert worker.start()
    time.sleep(0.1)  # whether the hold has begun or not, the stop must end the burst
    report = worker.stop()
    # The burst's first optimizer step is taken whenever the stop comes (min_burst_steps), the score follows it and
    # holds it: never a second step.
    assert not worker.spot.is_running and report["burst_steps"] == 1 and "scores" not in report
    assert not release.exists()


def test_a_stop_request_answers_during_a_step_and_the_queued_stop_publishes_it(fed):
    """request_stop answers with the step still in progress (`finishing`, what was done so far); stop() afterwards
    (what the pool queues behind it) collects the burst with that step and publishes a version."""
    import threading

    worker = fed()
    in_step, release = threading.Event(), threading.Event()
    step = worker.spot.trainer.train_step

    def held_step(batch):
        in_step.set()
        assert release.wait(60), "hang guard: the test never released the step"
        return step(batch)

    worker.spot.trainer.train_step = held_step
    assert worker.start() and in_step.wait(60)
    early = worker.request_stop()
    assert early["finishing"] is True and early["running"] is True and early["burst_steps"] == 0
    assert early["version"] == 0 and early["stop_latency_s"] < 5
    release.set()
    final = worker.stop()
    assert final["burst_steps"] == 1 and final["version"] == 1 and not final["running"]
    assert worker.request_stop()["finishing"] is False  # nothing runs now: a stop request is a plain status


def test_a_worker_is_pinned_to_the_cores_it_is_given(varied_qwen2):
    """The drafter worker's process takes its replica's cores (here: the test process's first core, restored)."""
    import os

    before = os.sched_getaffinity(0)
    core = min(before)
    try:
        worker = make_worker(varied_qwen2[0], cpu_cores=[core])
        assert worker.cpu_cores == [core] and os.sched_getaffinity(0) == {core}
        assert worker.status()["cpu_cores"] == [core]
    finally:
        for thread in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(thread), before)
            except OSError:
                pass


def test_load_of_a_missing_checkpoint_raises(fed, tmp_path):
    with pytest.raises(FileNotFoundError, match="No drafter trainer checkpoint"):
        fed().load(str(tmp_path / "nothing"), version=1, total_steps=1)


def test_init_from_an_exported_drafter_loads_its_weights(varied_qwen2, tmp_path):
    source = make_worker(varied_qwen2[0])
    drafter = source.spot.trainer.model
    torch.manual_seed(3)
    with torch.no_grad():
        for param in drafter.parameters():
            param.add_(0.05 * torch.randn_like(param))
    export_eagle(drafter, tmp_path / "eagle")
    expected = model_state(source)

    worker = make_worker(varied_qwen2[0], DrafterConfig(init=str(tmp_path / "eagle")))
    assert worker.weights()[0] == 0
    assert_same_tensors(worker.weights()[1], expected)
    assert worker.spot.trainer.model.target is worker.target  # attached to this worker's (updatable) target
    assert differs(expected, model_state(make_worker(varied_qwen2[0])))  # not what init=target gives


# ----- fault injection -------------------------------------------------------------------------------------------


class InjectedExit(Exception):
    pass


@pytest.fixture()
def exits(monkeypatch) -> list[int]:
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        raise InjectedExit(code)

    monkeypatch.setattr(worker_module.os, "_exit", fake_exit)
    return codes


def test_exit_on_start_fault_ends_the_process_on_that_start_only(fed, exits):
    worker = fed(fault="exit_on_start=2")
    assert worker.start() is True
    worker.stop()
    with pytest.raises(InjectedExit):
        worker.start()
    assert exits == [1] and not worker.spot.is_running  # it exits before training starts
    assert worker.start() is True  # a 3rd start is fine
    worker.stop()
    assert exits == [1]


def test_the_fault_comes_from_the_environment_unless_given(fed, exits, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "exit_on_start=1")
    with pytest.raises(InjectedExit):
        fed().start()
    explicit = fed(fault="")
    assert explicit.start() is True  # an explicit empty fault overrides the environment
    explicit.stop()
    monkeypatch.delenv(FAULT_ENV)
    unset = fed()
    assert unset.start() is True
    unset.stop()
    assert exits == [1]


def test_an_injected_out_of_memory_ends_that_burst_and_the_worker_trains_on(fed):
    worker = fed(fault="oom_on_start=1,exit_on_start=9")
    assert worker.start() is True
    deadline = time.monotonic() + 60
    while worker.spot.is_running:  # the first step raises and ends the burst (a stop now could come before it)
        assert time.monotonic() < deadline, "hang guard: the injected out-of-memory burst did not end in 60 s"
        time.sleep(0.002)
    status = worker.stop()
    assert status["burst_steps"] == 0 and status["memory_stops"] == 1 and status["version"] == 0
    assert "out of memory (injected" in status["last_error"]
    status = burst(worker, 2)  # the next burst trains
    assert status["burst_steps"] == 2 and status["version"] == 1 and status["last_error"] is None


def test_ping_reports_the_rank(varied_qwen2):
    assert make_worker(varied_qwen2[0], rank=5).ping() == 5


def test_evaluate_scores_the_trained_and_the_initial_drafter_on_the_same_samples(fed, samples):
    worker = fed()
    before = worker.evaluate(samples)
    assert before["online_top1_accuracy"] == before["frozen_top1_accuracy"]  # nothing trained yet
    assert before["online_num_pairs"] == sum(int(s.response_mask[1:].sum()) for s in samples)
    burst(worker, 30)
    after = worker.evaluate(samples)
    # The frozen copy is the initial drafter, untouched by training (and by the shared target weights' identity).
    assert after["frozen_accept_prob"] == pytest.approx(before["frozen_accept_prob"])
    # Training on these very samples must make the online drafter agree with the target more.
    assert after["online_accept_prob"] > before["online_accept_prob"]
    assert after["online_est_acceptance_length"] > after["frozen_est_acceptance_length"]
    assert 0.0 <= after["online_top1_accuracy"] <= 1.0


def test_evaluate_scores_about_eval_max_pairs_positions_and_none_at_zero(varied_qwen2, samples):
    import dataclasses

    few = make_worker(varied_qwen2[0], dataclasses.replace(CONFIG, eval_max_pairs=40))
    scored = few.evaluate(samples)["online_num_pairs"]
    assert 0 < scored < sum(s.num_loss_pairs for s in samples) and abs(scored - 40) <= 20  # whole samples of ~19
    off = make_worker(varied_qwen2[0], dataclasses.replace(CONFIG, eval_max_pairs=0))
    assert off.evaluate(samples) == {}


def test_evaluate_refuses_while_training_runs(fed, samples):
    worker = fed()
    assert worker.spot.start()
    try:
        with pytest.raises(RuntimeError, match="stop\\(\\) first"):
            worker.evaluate(samples)
    finally:
        worker.stop()


def test_a_worker_holds_the_targets_embedding_head_and_last_layer_only(varied_qwen2):
    from verl_tlt.drafter.model import EagleDrafterModel
    from verl_tlt.modeling.weights import load_drafter_parts, load_pretrained

    full, _ = load_pretrained(str(varied_qwen2[0]))
    parts = load_drafter_parts(str(varied_qwen2[0]))
    assert len(parts.model.layers) == 1 and len(full.model.layers) > 1
    assert sum(p.numel() for p in parts.parameters()) < sum(p.numel() for p in full.parameters())
    from_full, from_parts = EagleDrafterModel.from_target(full), EagleDrafterModel.from_target(parts)
    for name, tensor in from_full.state_dict().items():
        assert torch.equal(tensor, from_parts.state_dict()[name]), name  # the same start: the last layer
    features = torch.randn(2, full.spec.hidden_size, generator=torch.Generator().manual_seed(0))
    assert torch.equal(from_parts.logits(features), from_full.logits(features))
    assert torch.equal(parts.model.embed_tokens.weight, full.model.embed_tokens.weight)


def test_a_config_that_does_not_describe_the_weights_fails_from_the_headers(varied_qwen2, tmp_path):
    import json
    import shutil

    from verl_tlt.modeling.weights import header_shapes, load_drafter_parts

    shapes = header_shapes(str(varied_qwen2[0]))
    assert (
        shapes["model.embed_tokens.weight"][1]
        == json.loads((varied_qwen2[0] / "config.json").read_text())["hidden_size"]
    )
    wrong = tmp_path / "wrong"
    shutil.copytree(varied_qwen2[0], wrong)
    config = json.loads((wrong / "config.json").read_text())
    config["vocab_size"] += 8  # a config of another model of the family
    (wrong / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"'model.embed_tokens.weight' has shape .* in its safetensors header"):
        load_drafter_parts(str(wrong))


def test_scores_stop_at_eval_max_seconds_with_both_drafters_on_the_same_samples(varied_qwen2, samples):
    """The time bound cuts between sample groups, never between the online and the frozen drafter."""
    from verl_tlt.drafter.evaluate import evaluate_drafter, evaluate_within

    worker = make_worker(varied_qwen2[0])
    models = {"online": worker.spot.trainer.model, "frozen": worker.frozen}
    ticks = iter(range(100))  # each clock read is a second later: the bound runs out after the first group
    scores, scored = evaluate_within(models, samples, 48, max_seconds=0.5, clock=lambda: float(next(ticks)))
    assert scored == 2  # the first group: two samples within 48 tokens
    first_group_pairs = sum(s.num_loss_pairs for s in samples[:2])
    assert scores["online"]["num_pairs"] == scores["frozen"]["num_pairs"] == first_group_pairs
    # Unbounded, group by group, the merge equals one evaluation of everything on the per-pair means that use no
    # noise (the noise restarts per group, so the shared-noise estimates differ slightly).
    merged, scored = evaluate_within(models, samples, 48, max_seconds=0)
    whole = evaluate_drafter(models["online"], samples, 48)
    assert scored == len(samples) and merged["online"]["num_pairs"] == whole["num_pairs"]
    for key in ("top1_accuracy", "accept_prob", "est_acceptance_length", "chain_greedy_acceptance_length"):
        assert merged["online"][key] == pytest.approx(whole[key]), key


def test_a_stop_interrupts_a_score_within_one_noise_draw_and_the_group_is_scored_afresh(varied_qwen2, samples):
    """A burst's stop must not wait for a whole score group (20 s at a 49k vocabulary on one core): the score checks
    before every noise draw, drops the interrupted group, and the next step scores it from the start."""
    from verl_tlt.drafter.evaluate import COUPLING_DRAWS, ScoreInterrupted, ScoreRun, evaluate_drafter

    worker = make_worker(varied_qwen2[0])
    model = worker.spot.trainer.model
    checks = []

    def stop_at_third_check():
        checks.append(1)
        return len(checks) >= 3

    model.train()
    with pytest.raises(ScoreInterrupted):
        evaluate_drafter(model, samples[:2], 48, should_stop=stop_at_third_check)
    assert len(checks) == 3 < COUPLING_DRAWS  # stopped inside the first level's first chunk
    assert model.training  # the training mode it had, although the score was cut short
    stopping = [True]
    run = ScoreRun({"online": model, "frozen": worker.frozen}, samples, 48, 0, should_stop=lambda: stopping[0])
    assert run.step() is False and run.parts_scored() == [] and not run.finished  # interrupted: nothing kept
    stopping[0] = False
    while run.step():
        pass
    scores, scored = run.result()
    assert run.finished and scored == len(samples)
    assert scores["online"]["num_pairs"] == evaluate_drafter(model, samples, 48)["num_pairs"]


def test_evaluate_reports_what_it_scored_and_how_long_it_took(varied_qwen2, samples):
    scores = make_worker(varied_qwen2[0]).evaluate(samples)
    assert scores["samples"] == len(samples) and scores["seconds"] > 0
    assert scores["online_num_pairs"] == scores["frozen_num_pairs"] == sum(s.num_loss_pairs for s in samples)
