"""Response-length models: reproducible, capped, growing, and read from traces."""

from __future__ import annotations

import json
import random

import pytest

from verl_tlt.sim.lengths import GroupLengths, TraceLengths


def test_a_step_is_prompts_times_group_size_lengths_reproducible_by_seed():
    model = GroupLengths(median_tokens=100, prompt_sigma=0.5, sample_sigma=0.5, max_tokens=1000)
    first = model.step(0, prompts=4, group_size=3, rng=random.Random(1))
    assert len(first) == 12 and first == model.step(0, 4, 3, random.Random(1))
    assert first != model.step(0, 4, 3, random.Random(2))


def test_lengths_are_capped_and_without_spread_equal_the_median():
    flat = GroupLengths(median_tokens=100, prompt_sigma=0.0, sample_sigma=0.0, max_tokens=1000)
    assert set(flat.step(0, 3, 2, random.Random(0))) == {100}
    capped = GroupLengths(median_tokens=100, prompt_sigma=3.0, sample_sigma=0.0, max_tokens=150)
    lengths = capped.step(0, 200, 1, random.Random(0))
    assert max(lengths) == 150 and min(lengths) >= 1


def test_siblings_share_their_prompts_length_scale():
    model = GroupLengths(median_tokens=1000, prompt_sigma=2.0, sample_sigma=0.0, max_tokens=10**9)
    lengths = model.step(0, 5, 4, random.Random(3))
    groups = [lengths[i : i + 4] for i in range(0, 20, 4)]
    assert all(len(set(group)) == 1 for group in groups) and len({g[0] for g in groups}) == 5


def test_the_median_grows_by_the_factor_per_step():
    model = GroupLengths(median_tokens=100, prompt_sigma=0.0, sample_sigma=0.0, max_tokens=10**6, growth_per_step=2)
    assert model.step(3, 1, 1, random.Random(0)) == [800]
    assert model.quantile(0.5, step=3) == pytest.approx(800)


def test_bad_settings_name_the_keys():
    with pytest.raises(ValueError, match="median_tokens"):
        GroupLengths(median_tokens=10, prompt_sigma=0, sample_sigma=0, max_tokens=5)


def test_traces_from_a_json_list_cycle_over_steps(tmp_path):
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps([[1, 2], [3]]))
    trace = TraceLengths.from_file(path)
    assert [trace.step(i, 0, 0, random.Random()) for i in range(3)] == [[1, 2], [3], [1, 2]]


def test_traces_from_rollout_records_join_replicas_and_skip_validation(tmp_path):
    path = tmp_path / "trace.jsonl"
    lines = [
        {"rollout_index": 0, "response_tokens": [5, 6]},
        {"rollout_index": 0, "response_tokens": [7]},
        {"rollout_index": 1, "response_tokens": [9], "validation": True},
        {"rollout_index": 2, "response_tokens": [8]},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines))
    trace = TraceLengths.from_file(path)
    assert trace.steps == ((5, 6, 7), (8,))


def test_a_file_that_is_not_a_trace_says_what_to_give(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"something": 1}')
    with pytest.raises(ValueError, match="JSON list of lists"):
        TraceLengths.from_file(path)
