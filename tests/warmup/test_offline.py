"""Offline warm-up: generate with the target, train on its hidden states, export a loadable drafter."""

from __future__ import annotations

import torch

from verl_tlt.config import DrafterConfig
from verl_tlt.drafter.load import load_eagle
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.drafts.eagle import EagleDrafter
from verl_tlt.warmup.offline import collect_samples, warmup_drafter

PROMPTS = [[5, 6, 7], [10, 11], [12, 13, 14, 15], [21], [30, 31, 32], [40, 41]]


def test_collected_samples_pair_tokens_with_the_targets_hidden_states(varied_qwen2):
    path, hf_model = varied_qwen2
    engine = RolloutEngine.from_pretrained(str(path))
    (sample,) = collect_samples(engine, PROMPTS[:1], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    with torch.no_grad():
        reference = hf_model(sample.token_ids.unsqueeze(0), output_hidden_states=True).hidden_states[-1][0]
    assert torch.allclose(sample.hidden_states, reference, atol=1e-5)
    assert sample.response_mask.tolist() == [False] * 3 + [True] * 6


def test_warmup_exports_a_drafter_that_beats_the_untrained_one(varied_qwen2, tmp_path):
    path, _ = varied_qwen2
    config = DrafterConfig(lr=3e-3, max_tokens_per_batch=128)
    report = warmup_drafter(
        str(path), PROMPTS, tmp_path / "drafter", num_steps=300, temperature=0.0, max_tokens=30, config=config
    )
    assert report.train_steps == 300 and report.num_samples == len(PROMPTS)
    engine = RolloutEngine.from_pretrained(str(path))
    engine.set_drafter(EagleDrafter(load_eagle(report.output_dir, engine.model)))
    outputs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True), "4_1_4")
    steps = sum(o.stats["num_verify_steps"] for o in outputs)
    assert (sum(o.stats["num_accepted_tokens"] for o in outputs) + steps) / steps > 2.0


def test_from_pretrained_loads_an_exported_drafter_by_path(varied_qwen2, tmp_path):
    from verl_tlt.drafter.export import export_eagle
    from verl_tlt.drafter.model import EagleDrafterModel

    path, _ = varied_qwen2
    target = RolloutEngine.from_pretrained(str(path))
    exported = EagleDrafterModel.from_target(target.model)
    export_eagle(exported, tmp_path / "drafter")
    engine = RolloutEngine.from_pretrained(str(path), drafter=str(tmp_path / "drafter"))
    assert torch.equal(engine.drafter.model.fc.weight, exported.fc.weight)  # the drafter at that path
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outputs = engine.generate(PROMPTS, params, "3_2_5")
    assert [o.token_ids for o in outputs] == [o.token_ids for o in target.generate(PROMPTS, params)]
    assert sum(o.stats["num_verify_steps"] for o in outputs) > 0  # it drafted


def test_warmup_reports_progress_of_answers_hidden_states_and_training(varied_qwen2, tmp_path, caplog):
    import logging

    path, _ = varied_qwen2
    with caplog.at_level(logging.INFO, logger="verl_tlt.progress"):
        warmup_drafter(
            str(path),
            PROMPTS,
            tmp_path / "drafter",
            num_steps=2,
            temperature=(0.0, 1.0),
            max_tokens=4,
            cache_root=tmp_path / "cache",
        )
    lines = [record.getMessage() for record in caplog.records if record.name == "verl_tlt.progress"]
    for what in ("T=0 answers: 6/6 answers", "T=0 hidden states: 6/6", "T=1 answers: 6/6", "T=1 hidden states: 6/6"):
        assert any(line.startswith(f"drafter warm-up, {what}") for line in lines), (what, lines)
    assert any(line.startswith("drafter warm-up training: 2/2 optimizer steps") for line in lines), lines


def small_warmup(path, tmp_path, out: str = "drafter", **kwargs):
    kwargs.setdefault("num_steps", 20)
    config = DrafterConfig(lr=3e-3, max_tokens_per_batch=64, input_noise=0.1)
    return warmup_drafter(
        str(path),
        PROMPTS,
        tmp_path / out,
        temperature=(0.0, 1.0),
        max_tokens=12,
        config=config,
        cache_root=tmp_path / "cache",
        **kwargs,
    )


def test_a_warmup_run_again_resumes_where_it_stopped_and_ends_where_one_run_would(varied_qwen2, tmp_path):
    from verl_tlt.drafter.load import load_eagle
    from verl_tlt.warmup.offline import state_dir_of

    path, _ = varied_qwen2
    whole = small_warmup(path, tmp_path, "whole", num_steps=20)
    first = small_warmup(path, tmp_path, "halves", num_steps=10)
    second = small_warmup(path, tmp_path, "halves", num_steps=20)
    assert not whole.collected_from_cache and first.collected_from_cache and second.collected_from_cache
    assert (first.resumed_from_step, second.resumed_from_step, second.train_steps) == (0, 10, 20)
    assert (state_dir_of(tmp_path / "halves") / "state.json").is_file()
    engine = RolloutEngine.from_pretrained(str(path))
    resumed, straight = load_eagle(tmp_path / "halves", engine.model), load_eagle(tmp_path / "whole", engine.model)
    for name, tensor in straight.state_dict().items():
        assert torch.allclose(resumed.state_dict()[name].float(), tensor.float(), atol=1e-6), name
    assert resumed.draft_vocab is not None  # the export carries the draft vocabulary


def test_a_spent_budget_stops_training_with_a_checkpoint_and_an_export(varied_qwen2, tmp_path):
    path, _ = varied_qwen2
    report = small_warmup(path, tmp_path, budget_seconds=1e-9)  # spent before training starts
    assert report.stopped_by == "budget" and report.train_steps == 0
    assert (tmp_path / "drafter" / "config.json").is_file()
    again = small_warmup(path, tmp_path, num_steps=3)
    assert again.stopped_by == "max_steps" and again.train_steps == 3 and again.resumed_from_step == 0


def test_checkpoints_every_stretch_keep_the_step_count(varied_qwen2, tmp_path):
    path, _ = varied_qwen2
    report = small_warmup(path, tmp_path, num_steps=15, checkpoint_every_s=0.01)
    assert report.train_steps == 15 and report.stopped_by == "max_steps"


def test_the_report_has_the_sparse_teachers_loss_gap(varied_qwen2, tmp_path):
    path, _ = varied_qwen2
    gap = small_warmup(path, tmp_path, num_steps=1).teacher_loss_gap
    assert gap["top_k"] == 64 and 0 < gap["top_k_mass"] <= 1
    assert gap["dense_logit_loss"] > 0 and gap["sparse_logit_loss"] > 0


def test_a_bf16_collection_is_cached_apart_from_fp32_and_fp32_keys_are_unchanged(tmp_path):
    from verl_tlt.warmup.collect import collection_key

    (tmp_path / "config.json").write_text("{}")
    args = (tmp_path, [[1, 2]], [0.0], 8, 0, 0)
    fp32 = collection_key(*args)
    assert collection_key(*args, "float32") == fp32  # what earlier runs cached stays valid
    assert collection_key(*args, "bfloat16") != fp32  # GPU answers differ: never mixed up with CPU ones


def test_an_eagle3_warmup_collects_its_layers_and_exports_a_drafter_that_drafts_well(tmp_path):
    """The EAGLE-3 warm-up records the target's feature layers with each token (cached apart from EAGLE-1's
    collection), trains with its recipe and exports what `from_pretrained(drafter=...)` serves."""
    from tests.engine.conftest import build_tiny_model
    from verl_tlt.drafter.eagle3_model import Eagle3DrafterModel

    build_tiny_model("qwen2", tmp_path / "target", weight_std=0.2, num_layers=5)
    config = DrafterConfig(family="eagle3", lr=3e-3, max_tokens_per_batch=128, draft_vocab_size=64)
    report = warmup_drafter(
        str(tmp_path / "target"),
        PROMPTS,
        tmp_path / "drafter",
        num_steps=150,
        temperature=0.0,
        max_tokens=30,
        config=config,
        cache_root=tmp_path / "cache",
    )
    assert report.train_steps == 150 and report.teacher_loss_gap  # the gap is measured on the captured layers too
    engine = RolloutEngine.from_pretrained(str(tmp_path / "target"), drafter=report.output_dir)
    assert isinstance(engine.drafter.model, Eagle3DrafterModel) and engine.model.feature_layers == (1, 2, 4)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    outputs = engine.generate(PROMPTS, params, "4_1_4")
    plain = RolloutEngine.from_pretrained(str(tmp_path / "target")).generate(PROMPTS, params)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]
    steps = sum(o.stats["num_verify_steps"] for o in outputs)
    assert (sum(o.stats["num_accepted_tokens"] for o in outputs) + steps) / steps > 2.0
    eagle1 = warmup_drafter(
        str(tmp_path / "target"),
        PROMPTS,
        tmp_path / "eagle1",
        num_steps=1,
        temperature=0.0,
        max_tokens=30,
        config=DrafterConfig(max_tokens_per_batch=128),
        cache_root=tmp_path / "cache",
    )
    assert not eagle1.collected_from_cache  # EAGLE-1 answers are recorded without the layers: another entry
