"""Timing a replica's decode steps per arm and batch size: every arm timed, nothing left behind in the engine."""

from __future__ import annotations

import pytest

from tests.engine.drafters import HFModelDrafter
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.step_costs import measure_step_costs, timed_batch_sizes
from verl_tlt.policy import PLAIN
from verl_tlt.spec.strategy import SpecStrategy

STRATEGIES = [SpecStrategy.parse(name) for name in ("4_1_4", "2_2_3", "suffix:4_1_4")]


def test_the_batch_sizes_stop_at_the_threshold_and_the_engines_limit():
    assert timed_batch_sizes(32, 64) == [1, 4, 16]  # beyond 16: extrapolated
    assert timed_batch_sizes(8, 64) == [1, 4, 8]
    assert timed_batch_sizes(32, 6) == [1, 4, 6]
    assert timed_batch_sizes(1, 4) == [1]


def test_every_drafter_arm_and_plain_are_timed_and_the_engine_is_left_as_it_was(varied_qwen2):
    path, hf_model = varied_qwen2
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=4, drafter=HFModelDrafter(hf_model))
    prompts, params = [[5, 6, 7], [8, 9]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    before = [o.token_ids for o in engine.generate(prompts, params)]
    stats_before = engine.stats.as_dict()
    lines = []
    table = measure_step_costs(engine, [1, 3], STRATEGIES, report=lines.append)
    assert set(table.seconds) == {PLAIN, "4_1_4", "2_2_3"}  # group-draft arms are not the drafter's: not timed
    assert all(set(by_batch) == {1, 3} and min(by_batch.values()) > 0 for by_batch in table.seconds.values())
    assert len(lines) == 2 and lines[0].startswith("batch 1: plain")
    assert not engine.has_unfinished() and engine.stats.as_dict() == stats_before  # no step counted
    assert [o.token_ids for o in engine.generate(prompts, params)] == before  # same outputs afterwards


def test_without_a_drafter_only_plain_is_timed(varied_qwen2):
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]), max_num_seqs=2)
    assert set(measure_step_costs(engine, [1, 2], STRATEGIES).seconds) == {PLAIN}


def test_a_busy_engine_or_a_short_context_is_refused(varied_qwen2):
    path, hf_model = varied_qwen2
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=2, drafter=HFModelDrafter(hf_model))
    engine.add_request([5, 6], SamplingParams(temperature=0, max_tokens=4))
    with pytest.raises(RuntimeError, match="idle engine"):
        measure_step_costs(engine, [1], STRATEGIES)
    short = RolloutEngine.from_pretrained(str(path), max_num_seqs=2, max_model_len=24, drafter=HFModelDrafter(hf_model))
    with pytest.raises(ValueError, match="max_model_len >= "):
        measure_step_costs(short, [1], STRATEGIES)
