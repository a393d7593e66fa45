"""Calibration: a recorded rollout replayed from its own arrivals, lengths and measured step costs."""

from __future__ import annotations

import json

import pytest

from verl_tlt.sim.calibration import MeasuredSteps, read_rollouts, replay


def record(index, replica, start, submits, finish_order, lengths, finishes, costs, busy, validation=False):
    return {
        "replica": replica,
        "rollout_index": None if validation else index,
        "validation": validation,
        "start": start,
        "closed": max(finishes) + 1,
        "submit_times": submits,
        "finish_times": finishes,
        "engine_busy_s": busy,
        "response_tokens": lengths,
        "finish_submit_index": finish_order,
        "sd": {},
        "decode_costs": costs,
    }


def write(tmp_path, records):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_plain_rollout_is_replayed_exactly_from_its_own_costs(tmp_path):
    # One replica, two requests at t=100: lengths 3 and 5. Prefill (0.5 s) gives both a token, then decode steps of
    # 1 s: batch 2 for two steps, batch 1 for two more. Finish at 102.5 and 104.5.
    costs = {"2": {"plain": [4, 2.0, 2]}, "1": {"plain": [2, 2.0, 2]}}
    path = write(
        tmp_path,
        [
            record(0, 0, 100.0, [100.0, 100.0], [0, 1], [3, 5], [102.5, 104.5], costs, busy=4.5),
            record(None, 0, 200.0, [200.0], [0], [9], [201.0], {}, busy=1.0, validation=True),
        ],
    )
    rollouts, pooled = read_rollouts(path)
    assert len(rollouts) == 1 and rollouts[0].time_s == 4.5 and rollouts[0].prefill_busy_s == 0.5
    assert rollouts[0].replicas[0].lengths == [3, 5]
    result = replay(rollouts, pooled)
    assert result.prefill_step_s == 0.5
    assert result.predicted_s == [pytest.approx(4.5)] and result.total_ratio == pytest.approx(1.0)


def test_late_arrivals_are_paired_with_their_own_lengths(tmp_path):
    # The request submitted second (at +3 s) finished first: finish_submit_index says which length is whose.
    costs = {"1": {"plain": [6, 6.0, 6]}}
    path = write(tmp_path, [record(0, 0, 0.0, [0.0, 3.0], [1, 0], [1, 5], [4.0, 5.0], costs, busy=6.0)])
    (rollout,), _ = read_rollouts(path)
    assert rollout.replicas[0].arrivals == [3.0, 0.0] and rollout.replicas[0].lengths == [1, 5]


def test_measured_speculative_steps_commit_more_per_row():
    costs = {"4": {"plain": [50, 5.0, 10], "4_1_4": [150, 5.0, 10]}}  # mean batch 5: SD commits 3 per row per step
    seconds, per_row, _ = MeasuredSteps(costs).step(5)
    assert seconds == pytest.approx(0.5) and per_row == pytest.approx(2.0)  # half the steps SD: (1 + 3) / 2


def test_records_without_submission_pairing_are_refused(tmp_path):
    old = record(0, 0, 0.0, [0.0], [0], [1], [1.0], {"1": {"plain": [1, 1.0, 1]}}, busy=1.0)
    del old["finish_submit_index"]
    with pytest.raises(ValueError, match="finish_submit_index"):
        read_rollouts(write(tmp_path, [old]))
