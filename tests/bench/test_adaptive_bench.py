"""`bench adaptive` building blocks on a tiny model (the real run needs the trained toy target)."""

from __future__ import annotations

import time

from tests.engine.conftest import build_tiny_model
from tests.engine.drafters import HFModelDrafter
from verl_tlt.bench.adaptive_bench import (
    above_threshold_groups,
    fastest_steps,
    timed_run,
    worst_above_threshold_ratio,
)
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.policy import FixedBelowThreshold


def test_timed_run_records_steps_per_batch_size_and_restores_the_engine(tmp_path):
    hf_model = build_tiny_model("qwen2", tmp_path, weight_std=0.2)
    engine = RolloutEngine.from_pretrained(str(tmp_path), drafter=HFModelDrafter(hf_model), max_num_seqs=8)
    prompts = [[5 + i, 6 + i] for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (2, 2, 4, 4, 9, 9)]
    engine.generate(prompts[:1], params[:1])  # counters from an earlier run must not leak into the next one
    seconds, outputs, steps, stats = timed_run(engine, prompts, params, FixedBelowThreshold("3_1_3", threshold=2))
    assert seconds > 0 and [len(o.token_ids) for o in outputs] == [2, 2, 4, 4, 9, 9]
    assert set(steps) <= {6, 4, 2} and 2 in steps  # batch shrinks 6 -> 4 -> 2 as requests finish
    assert engine.policy is None and "_decode_step" not in vars(engine)  # instrumentation removed
    assert stats["steps_sd"] > 0 and stats["steps_plain"] > 0  # SD only at <= 2 running
    assert stats["tokens_plain"] + stats["tokens_sd"] == sum(len(o.token_ids) for o in outputs) - len(prompts)
    assert stats["policy_seconds_above_threshold"] > 0  # steps at 6 and 4 running asked the policy


def test_timed_run_times_the_policy_calls_above_its_threshold_only(tmp_path):
    hf_model = build_tiny_model("qwen2", tmp_path, weight_std=0.2)
    engine = RolloutEngine.from_pretrained(str(tmp_path), drafter=HFModelDrafter(hf_model), max_num_seqs=8)
    prompts = [[5 + i, 6 + i] for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    class SlowPolicy(FixedBelowThreshold):
        def select(self, batch_size):
            time.sleep(0.01)
            return super().select(batch_size)

    _, _, _, above = timed_run(engine, prompts, params, SlowPolicy("3_1_3", threshold=2))  # 4 running: all above
    _, _, _, below = timed_run(engine, prompts, params, SlowPolicy("3_1_3", threshold=8))  # all at or below
    assert above["policy_seconds_above_threshold"] >= 0.01 * 5 and below["policy_seconds_above_threshold"] == 0.0


def test_worst_above_threshold_ratio_groups_batch_sizes_and_needs_enough_steps():
    plain = {40: [1.0] * 5, 50: [1.0] * 5, 100: [2.0] * 5, 8: [9.0] * 9}
    adaptive = {40: [1.1] * 5, 50: [1.1] * 5, 100: [2.0] * 5, 8: [1.0] * 9}
    assert worst_above_threshold_ratio(plain, adaptive, threshold=32) == round(1.0 / 1.1, 3)
    assert worst_above_threshold_ratio({40: [1.0]}, {40: [2.0]}, threshold=32) is None  # too few steps
    groups = above_threshold_groups(plain, adaptive, threshold=32)
    assert list(groups) == ["32-63", "64-127"]  # batch 8 is below the threshold
    assert groups["32-63"] == {"steps": 10, "plain_step_ms": 1000.0, "adaptive_step_ms": 1100.0, "ratio": 0.909}


def test_groups_compare_the_steps_both_runs_have():
    plain = {40: [1.0] * 6, 41: [1.0] * 2}
    adaptive = {40: [1.0] * 5, 41: [1.5] * 2, 42: [9.0] * 3}  # batch 42 has no plain steps to pair with
    groups = above_threshold_groups(plain, adaptive, threshold=32)
    assert groups["32-63"]["steps"] == 7 and groups["32-63"]["ratio"] == round(7.0 / 8.0, 3)


def test_fastest_steps_pairs_steps_across_runs_so_stalls_drop_out_but_slow_steps_stay():
    runs = [{40: [1.0, 5.0, 1.0], 8: [2.0]}, {40: [4.0, 1.0, 1.0]}, {40: [1.0, 1.0, 1.0, 7.0], 8: [1.0]}]
    assert fastest_steps(runs) == {40: [1.0, 1.0, 1.0]}  # only steps that every run has (not batch 8, not a 4th)
    plain = fastest_steps([{40: [1.0] * 6}, {40: [1.0] * 5 + [3.0]}])
    stalls = fastest_steps([{40: [1.0, 4.0] * 3}, {40: [4.0, 1.0] * 3}])  # a stall at a different step each run
    slower = fastest_steps([{40: [1.2] * 6}, {40: [1.25] * 6}])  # every step slower in every run
    assert worst_above_threshold_ratio(plain, stalls, threshold=32) == 1.0
    assert worst_above_threshold_ratio(plain, slower, threshold=32) == round(1.0 / 1.2, 3)


def test_interleaved_best_takes_turns_keeps_the_fastest_run_and_each_steps_fastest_time():
    from verl_tlt.bench.adaptive_bench import interleaved_best

    order = []
    timings = {
        "a": iter([(2.0, "a-slow", {40: [1.0, 2.0]}, {"n": 1}), (1.0, "a-fast", {40: [1.5, 0.5], 20: [0.1]}, {"n": 2})])
    }
    timings["b"] = iter([(3.0, "b1", {}, {}), (4.0, "b2", {}, {}), (5.0, "b3", {}, {})])
    timings["a"] = iter([*timings["a"], (3.0, "a3", {40: [2.0, 2.0]}, {})])

    def variant(name):
        def run():
            order.append(name)
            return next(timings[name])

        return run

    best, round_seconds = interleaved_best(3, {"a": variant("a"), "b": variant("b")})
    assert order == ["a", "b", "b", "a", "a", "b"]  # round-robin, each round starting one later: drift hits both alike
    assert best["a"] == (1.0, "a-fast", {40: [1.0, 0.5]}, {"n": 2})  # batch 20: not in every run
    assert best["b"][:2] == (3.0, "b1")
    assert round_seconds == {"a": [2.0, 1.0, 3.0], "b": [3.0, 4.0, 5.0]}  # in round order, whoever went first


def test_paired_ratios_compare_the_runs_of_each_round():
    from verl_tlt.bench.adaptive_bench import paired_ratios

    rounds = {"fixed": [4.0, 6.0, 5.0], "adaptive": [5.0, 5.0, 5.0]}  # a slow second round hits fixed only
    assert paired_ratios(rounds, "fixed", "adaptive") == [0.8, 1.2, 1.0]


def test_interleaved_best_advances_progress_after_every_run():
    from tests.progress_probe import recording_progress
    from verl_tlt.bench.adaptive_bench import interleaved_best

    progress, lines = recording_progress(4, every_step=True)
    runs = {name: (lambda name=name: (1.0, name, {}, {})) for name in ("plain", "adaptive")}
    interleaved_best(2, runs, progress)
    assert progress.done == 4 and [line.split(", ")[0] for line in lines] == [
        f"probe: {n}/4 steps" for n in range(1, 5)
    ]
    assert lines[-1].endswith("round 2: plain")  # the second round starts one variant later
