"""The EAGLE-3 drafter: its start, its training (token loss, own head, unroll), its map, and its export round trip with
every silent-failure case of the map refused."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.engine.conftest import build_tiny_model
from verl_tlt.config import DrafterConfig
from verl_tlt.drafter.data import DrafterDataBuffer, DrafterSample
from verl_tlt.drafter.draft_vocab import DraftVocab
from verl_tlt.drafter.eagle3_model import Eagle3DrafterModel, default_aux_layers
from verl_tlt.drafter.export_eagle3 import export_eagle3
from verl_tlt.drafter.family import (
    drafter_for_state,
    drafter_from_init,
    export_drafter,
    feature_layers_for,
    feature_tokens,
    load_drafter,
)
from verl_tlt.drafter.trainer import DrafterTrainer
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.modeling.model import sequence_hidden_states
from verl_tlt.modeling.weights import load_drafter_parts

PROMPTS = [[5, 6, 7], [10, 11], [12, 13, 14, 15], [21], [30, 31, 32], [40, 41], [50], [60, 61, 62]]


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """(path, engine, samples): a 5-layer Qwen2 and its greedy answers captured as [final | layers 1, 2, 4]."""
    path = tmp_path_factory.mktemp("deep_qwen2")
    build_tiny_model("qwen2", path, weight_std=0.2, num_layers=5)
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=8)
    outputs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    engine.model.feature_layers = default_aux_layers(5)
    samples = []
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        ids = prompt + output.token_ids
        hidden = sequence_hidden_states(engine.model, ids)
        samples.append(DrafterSample(torch.tensor(ids), hidden, torch.arange(len(ids)) >= len(prompt)))
    engine.model.feature_layers = ()
    return path, engine, samples


def trainer_for(engine, samples, **config) -> DrafterTrainer:
    torch.manual_seed(0)
    config = {"lr": 3e-3, "max_tokens_per_batch": 128, "family": "eagle3", "draft_vocab_size": 64, **config}
    drafter_config = DrafterConfig(**config)
    model = drafter_from_init("target", engine.model, "eagle3", draft_vocab_size=drafter_config.draft_vocab_size)
    trainer = DrafterTrainer(model, DrafterDataBuffer(max_tokens=100_000), drafter_config)
    trainer.add_samples(samples)
    return trainer


def test_the_untrained_drafter_reads_the_target_head_at_its_last_feature_layer(deep):
    _, engine, samples = deep
    model = Eagle3DrafterModel.from_target(engine.model, draft_capacity=64)
    assert model.aux_layers == (1, 2, 4)
    hidden = engine.model.spec.hidden_size
    captured = samples[0].hidden_states
    from tests.engine.drafts.test_eagle3 import reference_features

    tokens = samples[0].token_ids[1:].tolist()
    features = reference_features(model, tokens, list(captured[:-1]))
    # Zeroed residual branches: the output feature is layer 4's input, read by the target's final norm and head.
    assert torch.allclose(features, captured[:-1, 3 * hidden :], atol=1e-5)
    lens = engine.model.lm_head(engine.model.model.norm(captured[:-1, 3 * hidden :]))
    assert torch.allclose(model.draft_logits(features), lens[:, model.draft_vocab_ids], atol=1e-4)
    assert model.chosen_vocab is None and torch.equal(model.draft_vocab.ids, torch.arange(64))  # filler only


def test_training_lowers_the_token_loss_trains_its_own_head_and_keeps_only_the_fused_layers(deep):
    _, engine, samples = deep
    trainer = trainer_for(engine, samples)
    hidden = engine.model.spec.hidden_size
    assert all(s.hidden_states.shape[-1] == 3 * hidden for s in trainer.buffer.samples.values())
    assert all(s.teacher is not None for s in trainer.buffer.samples.values())
    target_head = engine.model.lm_head.weight.clone()
    first = trainer.train(max_steps=1).last_metrics
    head_before = trainer.model.lm_head.detach().clone()
    report = trainer.train(max_steps=40)
    assert report.steps == 40
    assert first["hidden_loss"] == 0.0  # no feature loss: EAGLE-3's features are its own
    assert report.last_metrics["logit_loss"] < 0.8 * first["logit_loss"], (first, report.last_metrics)
    assert report.last_metrics["top1_accuracy"] > first["top1_accuracy"]
    assert trainer.config.unroll_depth == 3  # the family's recipe: the training-time-test unroll
    used = len(trainer.model.draft_vocab)
    assert not torch.equal(trainer.model.lm_head[:used], head_before[:used])  # its own head trains
    assert torch.equal(engine.model.lm_head.weight, target_head)  # the target's never does


def test_a_grown_map_keeps_every_trained_row_in_its_slot(deep):
    _, engine, samples = deep
    trainer = trainer_for(engine, samples[:2])
    trainer.train(max_steps=5)
    model = trainer.model
    before_slots, before_rows = model.draft_vocab.ids.clone(), model.lm_head.detach().clone()
    chosen = len(model.chosen_vocab)
    trainer.add_samples(samples[2:])
    trainer.apply_draft_vocab()
    grown = model.chosen_vocab
    assert len(grown) > chosen and torch.equal(grown.ids[:chosen], before_slots[:chosen])
    assert len(model.draft_vocab) == model.draft_capacity == 64  # the head's rows never change in number
    kept = model.draft_vocab.ids == before_slots
    assert bool(kept[:chosen].all()) and torch.equal(model.lm_head[kept], before_rows[kept])
    changed = ~kept
    assert changed.any()
    assert torch.equal(model.lm_head[changed], engine.model.lm_head.weight[model.draft_vocab.ids[changed]])


def test_an_unlabelled_sample_without_the_final_state_is_refused(deep):
    _, engine, samples = deep
    hidden = engine.model.spec.hidden_size
    stripped = DrafterSample(samples[0].token_ids, samples[0].hidden_states[:, hidden:], samples[0].response_mask)
    with pytest.raises(ValueError, match="final hidden state"):
        trainer_for(engine, [stripped])


def test_checkpoints_resume_and_states_rebuild_the_same_drafter(deep, tmp_path):
    _, engine, samples = deep
    trainer = trainer_for(engine, samples)
    trainer.train(max_steps=3)
    trainer.save_checkpoint(tmp_path / "ckpt", wait=True)
    expected = trainer.train(max_steps=2).last_metrics
    resumed = trainer_for(engine, [])
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.train(max_steps=2).last_metrics == pytest.approx(expected)
    rebuilt = drafter_for_state(trainer.model.state_dict(), engine.model)
    assert isinstance(rebuilt, Eagle3DrafterModel) and rebuilt.aux_layers == trainer.model.aux_layers
    assert torch.equal(rebuilt.draft_vocab.ids, trainer.model.draft_vocab.ids)
    assert torch.equal(rebuilt.lm_head, trainer.model.lm_head)


def test_the_export_is_vllms_eagle3_layout_and_loads_back_the_same_drafter(deep, tmp_path):
    path, engine, samples = deep
    trainer = trainer_for(engine, samples)
    trainer.train(max_steps=3)
    model = trainer.model
    target_config = json.loads((path / "config.json").read_text())
    out = export_drafter(model, tmp_path / "eagle3", target_config=target_config, metadata={"steps": 3})
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 1
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4] and config["num_aux_hidden_states"] == 3
    assert config["draft_vocab_size"] == model.draft_capacity and config["verl_tlt"]["format"] == "eagle3"
    assert config["verl_tlt"]["chosen_vocab_size"] == len(model.chosen_vocab)
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["fc.weight"].shape == (64, 3 * 64)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * 64
    assert "embed_tokens.weight" not in tensors and not any(k.startswith("model.") for k in tensors)
    assert torch.equal(tensors["d2t"] + torch.arange(model.draft_capacity), model.draft_vocab.ids)
    loaded = load_drafter(out, engine.model)
    assert isinstance(loaded, Eagle3DrafterModel)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    # A drafter worker's one-layer copy of the target loads it as well (it knows the target's depth).
    parts = load_drafter_parts(str(path))
    assert load_drafter(out, parts).aux_layers == (1, 2, 4)


def test_an_untrained_drafter_exports_filler_slots_and_every_export_has_the_heads_rows(deep, tmp_path):
    _, engine, samples = deep
    model = Eagle3DrafterModel.from_target(engine.model, draft_capacity=32)
    out = export_eagle3(model, tmp_path / "start")
    tensors = load_file(str(out / "model.safetensors"))
    assert torch.equal(tensors["lm_head.weight"], engine.model.lm_head.weight[:32])  # the lowest ids, the target's rows
    assert not tensors["d2t"].any()
    loaded = load_drafter(out, engine.model)
    assert loaded.chosen_vocab is None and torch.equal(loaded.draft_vocab.ids, torch.arange(32))
    trainer = trainer_for(engine, samples[:1], draft_vocab_size=32)
    trainer.apply_draft_vocab()
    trained = trainer.model
    assert 0 < len(trained.chosen_vocab) < 32
    again = export_eagle3(trained, tmp_path / "later")
    assert load_file(str(again / "model.safetensors"))["lm_head.weight"].shape == (32, 64)  # what vLLM allocated
    assert len(load_drafter(again, engine.model).chosen_vocab) == len(trained.chosen_vocab)


def damage(out, **changes):
    file = out / "model.safetensors"
    tensors = load_file(str(file))
    for name, value in changes.items():
        if value is None:
            tensors.pop(name)
        else:
            tensors[name] = value
    save_file(tensors, str(file))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"d2t": None}, "has no d2t"),
        ({"d2t": "short"}, "one entry per head row"),
        ({"d2t": "out_of_range"}, "must be distinct"),
        ({"d2t": "duplicate"}, "must be distinct"),
        ({"t2d": "wrong"}, "t2d disagrees"),
        ({"lm_head.weight": None}, "has no lm_head"),
        ({"midlayer.hidden_norm.weight": None}, "missing tensor"),
        ({"midlayer.extra.weight": "extra"}, "does not have"),
    ],
)
def test_a_damaged_map_or_tensor_set_is_refused_by_name(deep, tmp_path, change, message):
    _, engine, samples = deep
    trainer = trainer_for(engine, samples)
    out = export_drafter(trainer.model, tmp_path / "bad")
    d2t = load_file(str(out / "model.safetensors"))["d2t"]
    vocab_size = engine.model.spec.vocab_size
    values = {
        "short": d2t[:-1],
        "out_of_range": d2t + vocab_size,
        "duplicate": torch.cat([d2t[:1], d2t[:1] - 1, d2t[2:]]),
        "wrong": torch.zeros(vocab_size, dtype=torch.bool),
        "extra": torch.zeros(3),
    }
    damage(out, **{name: values.get(value, value) if value is not None else None for name, value in change.items()})
    with pytest.raises(ValueError, match=message):
        load_drafter(out, engine.model)


def test_layer_ids_the_target_lacks_or_none_at_all_are_refused(deep, tmp_path):
    _, engine, samples = deep
    out = export_drafter(trainer_for(engine, samples).model, tmp_path / "layers")
    config = json.loads((out / "config.json").read_text())
    for layers, message in (([1, 2, 5], "must be distinct, increasing and in"), (None, "names no target layers")):
        config["eagle_aux_hidden_state_layer_ids"] = layers
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = layers
        (out / "config.json").write_text(json.dumps(config))
        with pytest.raises(ValueError, match=message):
            load_drafter(out, engine.model)


def test_a_run_never_trains_another_family_than_it_asked_for(deep, tmp_path):
    _, engine, samples = deep
    out = export_drafter(trainer_for(engine, samples).model, tmp_path / "e3")
    with pytest.raises(ValueError, match="tlt.drafter.family=eagle3"):
        drafter_from_init(str(out), engine.model, "eagle")
    assert feature_layers_for("eagle3", str(out), 5) == (1, 2, 4)
    assert feature_layers_for("eagle3", "target", 30) == (2, 15, 27)
    assert feature_layers_for("eagle", "target", 30) == ()


def test_token_budgets_hold_the_same_bytes_for_eagle3():
    assert feature_tokens(12_000, "eagle", 3, labelled=True) == 12_000
    assert feature_tokens(12_000, "eagle3", 3, labelled=True) == 4_000
    assert feature_tokens(12_000, "eagle3", 3, labelled=False) == 3_000


@pytest.mark.parametrize(
    "config, message",
    [
        ({"teacher_top_k": 0}, "teacher_top_k > 0"),
        ({"draft_vocab_size": 0}, "draft_vocab_size > 0"),
        ({"logit_loss_weight": 0.0}, "logit_loss_weight > 0"),
        ({"family": "eagle2"}, "is not one of"),
    ],
)
def test_eagle3_settings_it_cannot_train_with_are_refused_by_key(config, message):
    with pytest.raises(ValueError, match=message):
        DrafterConfig(**{"family": "eagle3", **config})


def test_a_map_longer_than_the_head_is_refused(deep):
    _, engine, _ = deep
    model = Eagle3DrafterModel.from_target(engine.model, draft_capacity=4)
    with pytest.raises(ValueError, match="does not fit this EAGLE-3 drafter's head of 4 rows"):
        model.set_draft_vocab(DraftVocab(torch.arange(5), engine.model.spec.vocab_size, 5))
