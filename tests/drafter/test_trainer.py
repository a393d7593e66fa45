"""Drafter trainer: learns, stops within one step, resumes exactly, saves atomically, helps SD acceptance."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.file_faults import fail_moving_into_place
from verl_tlt.config import DrafterConfig
from verl_tlt.drafter import safe_state
from verl_tlt.drafter.checkpoint import LEGACY_FILE, write_checkpoint
from verl_tlt.drafter.data import DrafterDataBuffer, DrafterSample, pack
from verl_tlt.drafter.losses import drafter_losses
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.drafter.safe_state import STATE_FILE, TENSORS_FILE
from verl_tlt.drafter.trainer import DrafterTrainer, drafter_forward
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.drafts.eagle import EagleDrafter
from verl_tlt.files import previous_directory

PROMPTS = [[5, 6, 7], [10, 11], [12, 13, 14, 15], [21], [30, 31, 32], [40, 41], [50], [60, 61, 62]]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A tiny varied Qwen2 as engine + transformers model, and its greedy samples with hidden states."""
    from tests.engine.conftest import build_tiny_model

    path = tmp_path_factory.mktemp("drafter_target")
    hf_model = build_tiny_model("qwen2", path, weight_std=0.2)
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=8)
    outputs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    samples = []
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        ids = torch.tensor(prompt + output.token_ids)
        with torch.no_grad():
            hidden = hf_model(ids.unsqueeze(0), output_hidden_states=True).hidden_states[-1][0]
        samples.append(DrafterSample(ids, hidden, torch.arange(len(ids)) >= len(prompt)))
    return path, engine, samples


def make_trainer(engine, samples, seed: int = 0, **config) -> DrafterTrainer:
    """A trainer with the default recipe (sparse teacher labels, a draft vocabulary) unless `config` says otherwise."""
    torch.manual_seed(0)
    config.setdefault("lr", 3e-3)
    config.setdefault("max_tokens_per_batch", 128)
    model = EagleDrafterModel.from_target(engine.model)
    trainer = DrafterTrainer(model, DrafterDataBuffer(max_tokens=100_000), DrafterConfig(**config), seed=seed)
    trainer.add_samples(samples)
    return trainer


def test_training_lowers_the_loss_and_leaves_shared_weights_alone(target):
    _, engine, samples = target
    embedding_before = engine.model.model.embed_tokens.weight.clone()
    trainer = make_trainer(engine, samples)
    first = trainer.train(max_steps=1).last_metrics
    report = trainer.train(max_steps=60)
    assert report.steps == 60 and report.stopped_by == "max_steps"
    assert report.last_metrics["loss"] < 0.5 * first["loss"], (first, report.last_metrics)
    assert report.last_metrics["top1_accuracy"] > first["top1_accuracy"]
    assert torch.equal(engine.model.model.embed_tokens.weight, embedding_before)
    assert not any(k.startswith(("embed", "lm_head")) for k in trainer.model.state_dict())


def test_the_loss_weighs_its_parts_as_the_drafter_config_says(target):
    _, engine, samples = target
    report = make_trainer(engine, samples, hidden_loss_weight=2.0, logit_loss_weight=0.5).train(max_steps=1)
    parts = report.last_metrics
    assert parts["loss"] == pytest.approx(2.0 * parts["hidden_loss"] + 0.5 * parts["logit_loss"], rel=1e-5)


def test_the_seed_draws_the_input_noise(target):
    _, engine, samples = target

    def fc_after_one_step(seed: int) -> torch.Tensor:
        trainer = make_trainer(engine, samples, seed=seed, input_noise=0.1)
        trainer.train(max_steps=1)
        return trainer.model.fc.weight.detach().clone()

    assert torch.equal(fc_after_one_step(0), fc_after_one_step(0))
    assert not torch.equal(fc_after_one_step(0), fc_after_one_step(1))


def test_loss_ignores_prompt_positions(target):
    _, engine, samples = target
    model = EagleDrafterModel.from_target(engine.model)
    batch = pack([samples[0]])
    with torch.no_grad():
        base = drafter_losses(
            model, drafter_forward(model, batch, batch.input_hidden), batch.target_hidden, batch.loss_mask
        )
        changed_targets = batch.target_hidden.clone()
        changed_targets[~batch.loss_mask] = 123.0  # targets of non-loss pairs: must not matter
        other = drafter_losses(
            model, drafter_forward(model, batch, batch.input_hidden), changed_targets, batch.loss_mask
        )
    assert torch.equal(base["hidden_loss"], other["hidden_loss"]) and torch.equal(
        base["logit_loss"], other["logit_loss"]
    )


def test_packed_neighbours_do_not_change_a_samples_features(target):
    _, engine, samples = target
    model = EagleDrafterModel.from_target(engine.model)
    with torch.no_grad():
        alone = pack([samples[1]])
        together = pack([samples[0], samples[1]])
        features_alone = drafter_forward(model, alone, alone.input_hidden)[0]
        features_packed = drafter_forward(model, together, together.input_hidden)[0, -alone.num_pairs :]
    assert torch.allclose(features_alone, features_packed, atol=1e-5)


def test_stop_event_ends_training_within_one_step(target):
    """Another thread asks to stop while step 3 runs: training returns right after that step, whatever the timing."""
    _, engine, samples = target
    trainer = make_trainer(engine, samples)
    stop, real_step = threading.Event(), trainer.train_step

    def step_asked_to_stop_during_the_third(batch):
        metrics = real_step(batch)
        if trainer.global_step == 3:
            asker = threading.Thread(target=stop.set)  # as the coordinator does, from its own thread
            asker.start()
            asker.join()
        return metrics

    trainer.train_step = step_asked_to_stop_during_the_third
    report = trainer.train(stop=stop, max_steps=100)
    assert report.stopped_by == "stop" and report.steps == 3


def test_between_steps_runs_after_each_optimizer_step_so_a_stopped_burst_has_trained(target):
    """The worker scores between steps; a stop during the first score still leaves the first step taken."""
    _, engine, samples = target
    trainer = make_trainer(engine, samples)
    stop, seen = threading.Event(), []

    def score_then_stop() -> None:
        seen.append(trainer.global_step)
        stop.set()  # as a rollout that ends while the burst scores

    report = trainer.train(stop=stop, max_steps=5, between_steps=score_then_stop)
    assert seen == [1] and report.steps == 1 and report.stopped_by == "stop"
    stop.clear()
    seen.clear()
    trainer.train(max_steps=3, between_steps=lambda: seen.append(trainer.global_step))
    assert seen == [2, 3, 4]


def test_deadline_ends_training(target):
    _, engine, samples = target
    report = make_trainer(engine, samples).train(deadline=time.monotonic() + 0.2)
    assert report.stopped_by == "deadline"


def test_resume_continues_exactly_where_training_stopped(target, tmp_path):
    _, engine, samples = target
    straight = make_trainer(engine, samples, input_noise=0.1)
    straight.train(max_steps=6)
    interrupted = make_trainer(engine, samples, input_noise=0.1)
    interrupted.train(max_steps=3)
    interrupted.save_checkpoint(tmp_path / "ckpt", wait=True)
    resumed = make_trainer(engine, samples, input_noise=0.1)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.global_step == 3
    resumed.train(max_steps=3)
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_failed_save_keeps_the_previous_checkpoint(target, tmp_path, monkeypatch):
    _, engine, samples = target
    trainer = make_trainer(engine, samples)
    trainer.train(max_steps=1)
    trainer.save_checkpoint(tmp_path / "ckpt", wait=True)
    trainer.train(max_steps=1)

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safe_state, "save_file", broken_save)
    with pytest.raises(RuntimeError, match="disk full"):
        trainer.save_checkpoint(tmp_path / "ckpt", wait=True)
    trainer.save_checkpoint(tmp_path / "ckpt")  # in the background: logged when it fails, raised by the wait
    with pytest.raises(RuntimeError, match="disk full"):
        trainer.wait_for_save()
    monkeypatch.undo()
    restored = make_trainer(engine, samples)
    restored.load_checkpoint(tmp_path / "ckpt")
    assert restored.global_step == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp directories left behind


def test_a_save_interrupted_between_its_renames_keeps_the_previous_checkpoint(target, tmp_path, monkeypatch):
    """The old checkpoint is moved aside before the new one moves in: a failure in between puts it back, and a
    crash in between (nothing put back) still leaves it where load_checkpoint looks."""
    _, engine, samples = target
    trainer = make_trainer(engine, samples)
    trainer.train(max_steps=1)
    trainer.save_checkpoint(tmp_path / "ckpt", wait=True)
    trainer.train(max_steps=1)
    fail_moving_into_place(monkeypatch, "ckpt")
    with pytest.raises(RuntimeError, match="interrupted"):
        trainer.save_checkpoint(tmp_path / "ckpt", wait=True)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    (tmp_path / "ckpt").rename(previous_directory(tmp_path / "ckpt"))  # as a crash between the two renames leaves it
    restored = make_trainer(engine, samples)
    restored.load_checkpoint(tmp_path / "ckpt")
    assert restored.global_step == 1


def test_a_failed_load_leaves_the_trainer_as_it_was(target, tmp_path):
    _, engine, samples = target
    trainer = make_trainer(engine, samples)
    trainer.train(max_steps=1)
    state = trainer.state_dict(include_samples=False)
    state["model"]["fc.weight"] = torch.zeros(3, 3)  # another drafter's shape: the strict load fails part-way
    write_checkpoint(tmp_path / "ckpt", state)
    before = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    with pytest.raises(ValueError, match="Cannot load drafter trainer checkpoint"):
        trainer.load_checkpoint(tmp_path / "ckpt")
    assert all(torch.equal(before[name], value) for name, value in trainer.model.state_dict().items())
    assert trainer.global_step == 1


def test_a_non_finite_batch_takes_no_optimizer_step(target):
    """A batch with a NaN loss is skipped: one AdamW step on NaN gradients would poison its moments for good."""
    _, engine, samples = target
    bad = samples[0]
    poisoned = DrafterSample(bad.token_ids, torch.full_like(bad.hidden_states, float("nan")), bad.response_mask)
    trainer = make_trainer(engine, samples)
    trainer.train(max_steps=1)
    before = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    metrics = trainer.train_step(pack([poisoned]))
    assert metrics["skipped"] == 1.0 and trainer.global_step == 1
    assert all(torch.equal(before[name], value) for name, value in trainer.model.state_dict().items())
    report = trainer.train(max_steps=3)
    assert report.steps == 3 and report.skipped_steps == 0
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_evaluation_windows_long_samples_like_training(target, monkeypatch):
    """A packed batch's attention is quadratic in its length: evaluation must respect the batch budget too."""
    import verl_tlt.drafter.data as data
    from verl_tlt.drafter.evaluate import evaluate_drafter

    _, engine, samples = target
    sizes = []
    real_pack = data.pack

    def recording_pack(pieces, *args):
        batch = real_pack(pieces, *args)
        sizes.append(batch.num_pairs)
        return batch

    monkeypatch.setattr(data, "pack", recording_pack)
    model = EagleDrafterModel.from_target(engine.model)
    metrics = evaluate_drafter(model, samples[:2], max_tokens_per_batch=16)
    assert sizes and max(sizes) < 16
    assert metrics["num_pairs"] == sum(s.num_loss_pairs for s in samples[:2])


def test_evaluation_in_position_chunks_scores_as_the_whole_batch_does(target, monkeypatch):
    """Scoring runs a few positions at a time (memory bounded by the chunk, not the batch); the scores that use no
    noise are the same either way, and the noisy ones stay probabilities."""
    import verl_tlt.drafter.evaluate as evaluate

    _, engine, samples = target
    model = EagleDrafterModel.from_target(engine.model)
    with torch.no_grad():
        for param in model.parameters():  # off its start, so the drafter disagrees with the target somewhere
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(0)))
    whole = evaluate.evaluate_drafter(model, samples, 128)
    monkeypatch.setattr(evaluate, "EVAL_CHUNK_POSITIONS", 3)
    chunked = evaluate.evaluate_drafter(model, samples, 128)
    for key in ("top1_accuracy", "accept_prob", "chain_greedy_acceptance_length", "num_pairs"):
        assert chunked[key] == pytest.approx(whole[key], rel=1e-5), key
    assert 0.0 < whole["top1_accuracy"] < 1.0
    assert 0.0 <= chunked["coupled_accept_prob"] <= 1.0


def test_the_evaluation_subsample_is_whole_samples_evenly_spaced():
    from types import SimpleNamespace

    from verl_tlt.drafter.evaluate import subsample_for_evaluation

    samples = [SimpleNamespace(num_loss_pairs=10, index=i) for i in range(10)]
    assert [s.index for s in subsample_for_evaluation(samples, 30)] == [0, 3, 6]
    assert subsample_for_evaluation(samples, 100) == samples and subsample_for_evaluation(samples, 1)[0].index == 0
    assert subsample_for_evaluation([], 5) == []


def test_a_missing_checkpoint_is_not_found(target, tmp_path):
    _, engine, samples = target
    with pytest.raises(FileNotFoundError, match="No drafter trainer checkpoint at .*missing"):
        make_trainer(engine, samples).load_checkpoint(tmp_path / "missing")


class Planted:
    """Unpickling this creates `marker`: the stand-in for the code a planted pickle would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def edit_state(directory: Path, edit) -> None:
    document = json.loads((directory / STATE_FILE).read_text())
    edit(document["state"])
    (directory / STATE_FILE).write_text(json.dumps(document))


def swap_first_two_moments(state: dict) -> None:
    first, second = state["optimizer"]["state"]["__items__"][:2]
    first[1]["exp_avg"], second[1]["exp_avg"] = second[1]["exp_avg"], first[1]["exp_avg"]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: edit_state(d, lambda s: s.update(global_step=-2)), r"global_step must be an integer >= 0, found -2"),
        (lambda d: edit_state(d, lambda s: s["buffer"].pop("next_id")), r"buffer/next_id must be an integer"),
        (lambda d: edit_state(d, swap_first_two_moments), r"optimizer/state/0/exp_avg has shape"),
        (
            lambda d: (d / TENSORS_FILE).write_bytes((d / TENSORS_FILE).read_bytes()[:-100]),
            rf"{TENSORS_FILE} is not a readable safetensors file",
        ),
        (lambda d: torch.save({"model": Planted(d / "payload_ran")}, d / TENSORS_FILE), r"is a pickle"),
        (
            lambda d: [(d / STATE_FILE).unlink(), torch.save({"model": Planted(d / "payload_ran")}, d / LEGACY_FILE)],
            rf"it holds {LEGACY_FILE}, the pickle format",
        ),
    ],
    ids=["edited-step", "edited-cursor", "swapped-moments", "truncated-tensors", "planted-pickle", "legacy-pickle"],
)
def test_a_damaged_checkpoint_is_a_clear_error_and_leaves_the_trainer_as_it_was(target, tmp_path, damage, message):
    _, engine, samples = target
    trainer = make_trainer(engine, samples)
    trainer.train(max_steps=2)
    trainer.save_checkpoint(tmp_path / "ckpt", wait=True)
    damage(tmp_path / "ckpt")
    fresh = make_trainer(engine, samples)
    before = {name: value.clone() for name, value in fresh.model.state_dict().items()}
    with pytest.raises(ValueError, match=message) as error:
        fresh.load_checkpoint(tmp_path / "ckpt")
    assert str(tmp_path / "ckpt") in str(error.value)
    assert fresh.global_step == 0 and not fresh.optimizer.state
    assert all(torch.equal(before[name], value) for name, value in fresh.model.state_dict().items())
    assert not (tmp_path / "ckpt" / "payload_ran").exists()  # no pickle was ever run


@pytest.mark.slow
def test_trained_drafter_raises_acceptance_in_the_engine(target):
    # End to end: what the trainer learns (pairs, positions, masks) is what the engine's drafter uses.
    path, _, samples = target
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

    def acceptance(drafter_model):
        engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=8)
        drafter_model.attach(engine.model)
        engine.set_drafter(EagleDrafter(drafter_model))
        outputs = engine.generate(PROMPTS, params, strategy="4_1_4")
        steps = sum(o.stats["num_verify_steps"] for o in outputs)
        return (sum(o.stats["num_accepted_tokens"] for o in outputs) + steps) / steps

    _, engine, _ = target
    trainer = make_trainer(engine, samples)
    before = acceptance(trainer.model)
    trainer.train(max_steps=600)
    after = acceptance(trainer.model)
    assert after > before + 1.0 and after > 2.2, (before, after)  # measured: 1.04 -> 2.61


def test_the_shared_noise_agreement_is_exact_for_the_targets_own_distribution_and_right_for_two_tokens():
    """Keyed drafting accepts a draft when the drafter's and the target's Gumbel-max draws under one noise agree:
    always for the target's own distribution, however flat (where a greedy draft survives only with max p)."""
    from verl_tlt.drafter.evaluate import _coupled_agreement

    generator = torch.Generator().manual_seed(0)
    flat = torch.full((1, 4000, 2), 0.5)
    assert bool((_coupled_agreement(flat.log(), flat, generator) == 1.0).all())
    # Two tokens: draws agree unless the logistic noise difference falls between log(3/7) and log(7/3): 0.3 + 0.3.
    target_probs = torch.tensor([0.7, 0.3]).expand(1, 4000, 2)
    draft_logits = torch.tensor([0.3, 0.7]).log().expand(1, 4000, 2)
    agreement = _coupled_agreement(draft_logits, target_probs, generator).mean()
    assert float(agreement) == pytest.approx(0.6, abs=0.015)  # 32,000 draws: standard error 0.003


def test_training_on_the_unrolled_chain_improves_the_drafters_own_chain(target):
    """train_depth=2 also trains the second draft, which reads the drafter's own feature; depth 1 is what it was."""
    from verl_tlt.drafter.evaluate import evaluate_drafter

    _, engine, samples = target
    before = evaluate_drafter(make_trainer(engine, samples).model, samples, 128)
    chain = make_trainer(engine, samples, train_depth=2)
    report = chain.train(max_steps=40)
    assert report.steps == 40 and all(torch.isfinite(p).all() for p in chain.model.parameters())
    after = evaluate_drafter(chain.model, samples, 128)
    assert after["chain_acceptance_length"] > before["chain_acceptance_length"] + 0.2, (before, after)


def test_the_chain_estimate_is_at_most_the_depth_plus_one_and_at_least_one(target):
    from verl_tlt.drafter.evaluate import evaluate_drafter

    _, engine, samples = target
    metrics = evaluate_drafter(EagleDrafterModel.from_target(engine.model), samples, 128, depth=3)
    for key in ("chain_acceptance_length", "chain_greedy_acceptance_length"):
        assert 1.0 <= metrics[key] <= 4.0


def test_training_tells_progress_every_step_with_its_loss(target):
    from tests.progress_probe import recording_progress

    _, engine, samples = target
    progress, lines = recording_progress(3, every_step=True)
    report = make_trainer(engine, samples).train(max_steps=3, progress=progress)
    assert report.steps == 3 and progress.done == 3
    assert [line.split(",")[0] for line in lines] == ["probe: 1/3 steps", "probe: 2/3 steps", "probe: 3/3 steps"]
    assert f"loss {report.last_metrics['loss']:.4f}" in lines[-1]


def test_progress_counts_tokens_over_every_call_of_train(target):
    """The warm-up trains in stretches between checkpoints: its lines show the run's tokens, not the stretch's."""
    from tests.progress_probe import recording_progress

    _, engine, samples = target
    trainer = make_trainer(engine, samples)
    first = trainer.train(max_steps=2)
    progress, lines = recording_progress(1, every_step=True)
    second = trainer.train(max_steps=1, progress=progress)
    assert trainer.trained_tokens == first.tokens + second.tokens
    assert f"{first.tokens + second.tokens} tokens" in lines[-1]
    assert trainer.training_seconds == first.seconds + second.seconds
