"""Replaying a rollout from recorded step costs (`verl_tlt.bench.replay`), and recording them on an engine."""

from __future__ import annotations

import random

import pytest

from tests.engine.conftest import build_tiny_model
from tests.engine.drafters import HFModelDrafter
from verl_tlt.bench.replay import StepCosts, compare, expected_seconds, replay
from verl_tlt.bench.replay_bench import record_step_costs
from verl_tlt.config import SpeculativeConfig
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.policy import PLAIN, FixedBelowThreshold


def costs(**overrides) -> StepCosts:
    base = {
        "lengths": [6, 6],
        "prompt_tokens": 2.0,
        "catch_up_s_per_token": 0.1,
        "steps": {PLAIN: {2: [(1.0, 1.0)]}, "4_1_4": {2: [(3.0, 1.5)]}},
    }
    return StepCosts(**{**base, **overrides})


def test_plain_and_a_fixed_strategy_cost_what_was_recorded_plus_one_catch_up():
    assert replay(FixedBelowThreshold("4_1_4", threshold=0), costs(), random.Random(0)) == 6.0  # 6 plain steps
    # Speculating from the start: 2 steps of 3 tokens per row, the first also feeds the drafter both prompts (2 x 2).
    assert replay(FixedBelowThreshold("4_1_4", threshold=32), costs(), random.Random(0)) == pytest.approx(3.4)


def test_a_step_after_plain_ones_catches_the_drafter_up_on_them():
    # Plain while 2 rows run (2 steps), then row lengths 2 and 8 leave one row: 4_1_4 from then on.
    recording = costs(lengths=[2, 8], steps={PLAIN: {2: [(1.0, 1.0)]}, "4_1_4": {1: [(3.0, 1.5)]}})
    seconds = replay(FixedBelowThreshold("4_1_4", threshold=1), recording, random.Random(0))
    # 2 plain steps; then 6 tokens left: 2 SD steps, the first catching up on prompt (2) + 2 plain tokens.
    assert seconds == pytest.approx(2 * 1.0 + 2 * 1.5 + 0.1 * 4)


def test_fractional_tokens_per_row_keep_their_mean_and_rows_stop_at_their_length():
    recording = costs(lengths=[10_000], catch_up_s_per_token=0.0, steps={"4_1_4": {1: [(2.5, 1.0)]}})
    seconds = replay(FixedBelowThreshold("4_1_4", threshold=32), recording, random.Random(0))
    assert seconds == pytest.approx(10_000 / 2.5, rel=0.02)


def test_a_step_that_records_no_tokens_still_advances_every_row():
    recording = costs(lengths=[5], steps={"4_1_4": {1: [(0.0, 1.0)]}}, catch_up_s_per_token=0.0)
    assert replay(FixedBelowThreshold("4_1_4", threshold=32), recording, random.Random(0)) == 5.0


def test_a_recording_without_decode_steps_is_refused():
    with pytest.raises(ValueError, match="needs requests with decode steps"):
        costs(lengths=[0, 0])


def test_draws_come_from_the_nearest_recorded_batch_size():
    recording = costs(steps={PLAIN: {1: [(1.0, 1.0)], 8: [(1.0, 5.0)]}})
    rng = random.Random(0)
    assert recording.draw(PLAIN, 3, rng) == (1.0, 1.0) and recording.draw(PLAIN, 6, rng) == (1.0, 5.0)
    with pytest.raises(ValueError, match="no recorded steps for strategy '2_1_2'"):
        recording.draw("2_1_2", 1, rng)


def test_the_adaptive_policy_learns_the_better_strategy_on_a_replay():
    steps = {
        PLAIN: {size: [(1.0, 1.0)] for size in (1, 4, 16, 64)},
        "4_1_4": {size: [(4.0, 1.6), (3.0, 1.4)] for size in (1, 4, 16)},  # 2.3 tokens/row-second: best
        "8_4_16": {size: [(5.0, 4.0)] for size in (1, 4, 16)},  # 1.25: barely better than plain
    }
    lengths = [40] * 48 + [400] * 4 + [900] * 2
    recording = StepCosts(lengths, prompt_tokens=20.0, catch_up_s_per_token=0.001, steps=steps)
    config = SpeculativeConfig(strategies=("8_4_16", "4_1_4"), buckets=(1, 2, 4, 8, 16))
    result = compare(config, recording, seeds=4)
    assert result["best_fixed_strategy"] == "4_1_4"
    assert result["fixed_vs_plain"]["4_1_4"] > 1.8 > result["fixed_vs_plain"]["8_4_16"]
    assert result["adaptive_vs_best_fixed"] >= 0.9 and result["adaptive_vs_plain"] > 1.6


def test_replays_are_deterministic_per_seed():
    recording = costs(lengths=[30, 50, 70], steps={PLAIN: {3: [(1.0, 1.0), (1.0, 1.2)]}, "4_1_4": {2: [(2.0, 1.5)]}})
    first = expected_seconds(lambda seed: FixedBelowThreshold("4_1_4", 2), recording, seeds=3)
    assert first == expected_seconds(lambda seed: FixedBelowThreshold("4_1_4", 2), recording, seeds=3)


def test_step_costs_round_trip_through_json_and_refuse_other_files(tmp_path):
    recording = costs()
    recording.to_json(tmp_path / "costs.json")
    assert StepCosts.from_json(tmp_path / "costs.json") == recording
    (tmp_path / "other.json").write_text('{"benchmark": "adaptive"}')
    with pytest.raises(ValueError, match="not a step-cost recording.*--save-costs"):
        StepCosts.from_json(tmp_path / "other.json")


def test_recording_on_an_engine_keeps_plain_and_strategy_steps_and_the_catch_up_apart(tmp_path):
    hf_model = build_tiny_model("qwen2", tmp_path, weight_std=0.2)
    engine = RolloutEngine.from_pretrained(str(tmp_path), drafter=HFModelDrafter(hf_model), max_num_seqs=8)
    prompts = [[5 + i, 6 + i, 7 + i] for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (2, 2, 4, 4, 12, 12)]
    recording = record_step_costs(engine, prompts, params, ["3_1_3"], threshold=2, repeats=2)
    assert recording.lengths == [1, 1, 3, 3, 11, 11] and recording.prompt_tokens == 3.0
    assert set(recording.steps) == {PLAIN, "3_1_3"}
    assert set(recording.steps["3_1_3"]) == {2}  # speculation only at <= 2 running
    assert {6, 4} <= set(recording.steps[PLAIN])
    # Per round: the plain run's 11 decode steps, the fixed run's 3 plain ones (6 and 4 running), then speculation
    # at 2 running, whose first step (the catch-up on 2 x 6 unseen tokens) is not a step cost.
    assert sum(len(steps) for steps in recording.steps[PLAIN].values()) == 2 * (11 + 3)
    # The drafter is the target itself, so every draft is accepted: 8 tokens left = 2 steps of 4 per run, the first
    # of which is the catch-up (one per run, kept apart).
    assert [tokens for tokens, _ in recording.steps["3_1_3"][2]] == [4.0, 4.0]
    assert recording.catch_up_samples == 2
    assert engine.policy is None and "_decode_step" not in vars(engine)


def test_the_replay_command_applies_policy_overrides_to_a_saved_recording(tmp_path):
    import json

    from verl_tlt.bench.cli import main

    steps = {PLAIN: {1: [(1.0, 1.0)], 4: [(1.0, 1.5)]}, "4_1_4": {1: [(3.0, 1.5)], 4: [(3.0, 2.5)]}}
    StepCosts([30, 50, 70, 90], 4.0, 0.0, steps).to_json(tmp_path / "costs.json")
    out = tmp_path / "replay.json"
    argv = ["replay", "--costs", str(tmp_path / "costs.json"), "--seeds", "2", "--json", str(out)]
    main([*argv, "--strategies", "4_1_4", "--buckets", "1", "2", "--threshold", "4"])
    result = json.loads(out.read_text())
    assert result["policy"]["buckets"] == [1, 2] and result["policy"]["strategies"] == ["4_1_4"]
    assert result["best_fixed_strategy"] == "4_1_4" and result["fixed_vs_plain"]["4_1_4"] > 1.0
    assert {"adaptive_vs_best_fixed", "adaptive_vs_plain", "adaptive_cold_vs_plain"} <= set(result)
    with pytest.raises(ValueError, match=r"no steps for \['2_1_2'\]"):
        main([*argv, "--strategies", "2_1_2", "--threshold", "4", "--buckets", "1", "2"])


def test_recording_refuses_a_run_whose_drafter_failed(tmp_path):
    hf_model = build_tiny_model("qwen2", tmp_path, weight_std=0.2)

    class BrokenDrafter(HFModelDrafter):
        def begin(self, rows):
            raise RuntimeError("out of memory")

    engine = RolloutEngine.from_pretrained(str(tmp_path), drafter=BrokenDrafter(hf_model), max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with pytest.raises(RuntimeError, match="drafter failed while recording step costs: RuntimeError: out of memory"):
        record_step_costs(engine, [[5, 6], [7, 8]], params, ["3_1_3"], threshold=2, repeats=1)


def test_the_replay_command_reports_refused_overrides_as_usage_errors(tmp_path, capsys):
    from verl_tlt.bench.cli import main

    with pytest.raises(SystemExit):
        main(["replay", "--costs", str(tmp_path / "none.json"), "--threshold", "8", "--buckets", "1", "16"])
    assert "buckets must ascend strictly from 1 and stay <= tlt.speculative.threshold=8" in capsys.readouterr().err


def test_compare_advances_progress_once_per_replayed_seed_of_every_policy():
    from tests.progress_probe import recording_progress

    config = SpeculativeConfig(strategies=("4_1_4",), threshold=4, buckets=(1, 2))
    progress, lines = recording_progress(None)
    compare(config, costs(steps={PLAIN: {2: [(1.0, 1.0)]}, "4_1_4": {2: [(3.0, 1.5)]}}), seeds=3, progress=progress)
    assert progress.done == 3 * (len(config.strategies) + 3)  # plain, each fixed strategy, adaptive cold and warm


def test_recording_reports_each_rollout(tmp_path, caplog):
    import logging

    hf_model = build_tiny_model("qwen2", tmp_path, weight_std=0.2)
    engine = RolloutEngine.from_pretrained(str(tmp_path), drafter=HFModelDrafter(hf_model), max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with caplog.at_level(logging.INFO, logger="verl_tlt.progress"):
        record_step_costs(engine, [[5, 6], [7, 8]], params, ["3_1_3"], threshold=2, repeats=1)
    lines = [record.getMessage() for record in caplog.records if record.name == "verl_tlt.progress"]
    assert lines[-1].startswith("bench replay, recording step costs: 2/2 rollouts") and lines[-1].endswith("3_1_3")
