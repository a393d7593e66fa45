"""Rollout records: per-replica finish times and SD counters, their summary, and the tlt/tail|rollout|sd metrics."""

from __future__ import annotations

import json

import torch

from verl_tlt.metrics.rollout_metrics import rollout_metrics
from verl_tlt.metrics.rollout_trace import (
    SD_COUNTERS,
    RolloutTrace,
    acceptance_length,
    append_jsonl,
    rollout_summary,
    rollout_weights_sha256,
    weights_sha256,
)


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def sd(verify: int = 0, draft: int = 0, accepted: int = 0, output: int = 0) -> dict[str, int]:
    return dict(zip(SD_COUNTERS, (verify, draft, accepted, output), strict=True))


# ----- RolloutTrace ----------------------------------------------------------------------------------------------


def test_the_record_starts_at_the_first_submit_and_lists_every_finish():
    clock = FakeClock(10.0)
    trace = RolloutTrace(replica_rank=2, clock=clock)
    assert trace.on_submit() == 0
    clock.now = 11.0
    assert trace.on_submit() == 1  # later submits do not move the start
    trace.on_engine_step(0.25)
    trace.on_engine_step(1.0)
    clock.now = 12.5
    stats = {"num_verify_steps": 3, "num_accepted_tokens": 5, "num_output_tokens": 40, "other": 9}
    trace.on_finish(40, stats, submit_index=1)  # the second request finished first
    clock.now = 14.0
    trace.on_finish(7, {})
    clock.now = 15.0
    record = trace.close({"drafter_version": 3})
    assert record == {
        "replica": 2,
        "rollout_index": 0,
        "validation": False,
        "start": 10.0,
        "closed": 15.0,
        "submit_times": [10.0, 11.0],
        "finish_times": [12.5, 14.0],
        "engine_busy_s": 1.25,
        "response_tokens": [40, 7],
        "finish_submit_index": [1, None],
        "sd": sd(verify=3, accepted=5, output=40),
        "drafter_version": 3,
    }


def test_sd_counters_are_summed_over_finished_requests():
    trace = RolloutTrace(0, clock=FakeClock())
    trace.on_submit()
    trace.on_finish(10, sd(verify=2, draft=8, accepted=3, output=10))
    trace.on_finish(20, sd(verify=5, draft=20, accepted=9, output=20))
    assert trace.close()["sd"] == sd(verify=7, draft=28, accepted=12, output=30)


def test_close_without_submits_is_none_and_close_starts_a_fresh_record():
    clock = FakeClock(1.0)
    trace = RolloutTrace(0, clock=clock)
    assert trace.close() is None
    trace.on_submit()
    trace.on_finish(5, sd(verify=1, accepted=1))
    assert trace.close()["finish_times"] == [1.0]
    assert trace.close() is None  # the previous rollout is gone
    clock.now = 50.0
    trace.on_submit()
    clock.now = 52.0
    trace.on_finish(3, {})
    record = trace.close()
    assert record["start"] == 50.0 and record["finish_times"] == [52.0] and record["response_tokens"] == [3]
    assert record["sd"] == sd() and record["submit_times"] == [50.0] and record["engine_busy_s"] == 0.0


def test_the_default_clock_is_wall_time():
    trace = RolloutTrace(0)
    trace.on_submit()
    record = trace.close()
    assert 1.6e9 < record["start"] <= record["closed"]  # time.time(), comparable across processes


# ----- summaries -------------------------------------------------------------------------------------------------


def test_acceptance_length_counts_the_bonus_token():
    assert acceptance_length(sd(verify=4, accepted=6)) == 2.5  # (6 accepted + 4 bonus) / 4 verify steps
    assert acceptance_length(sd(verify=2)) == 1.0
    assert acceptance_length(sd(accepted=3)) is None
    assert acceptance_length({}) is None


def record(replica, start, closed, finishes, tokens, counters) -> dict:
    return {
        "replica": replica,
        "start": start,
        "closed": closed,
        "finish_times": finishes,
        "response_tokens": tokens,
        "sd": counters,
    }


RECORDS = [
    record(0, 100.0, 112.0, [101.0, 103.0, 110.0], [10, 30, 200], sd(verify=10, draft=40, accepted=20, output=30)),
    None,  # a replica that got no request this rollout
    record(1, 100.5, 111.0, [102.0, 104.0], [20, 40], sd(output=60)),
]


def test_rollout_summary_spans_all_replicas():
    assert rollout_summary(RECORDS) == {
        "start": 100.0,
        "last_finish": 110.0,
        "closed": 111.0,  # the first replica asleep
        "num_responses": 5,
        "num_verify_steps": 10,
        "num_draft_tokens": 40,
        "num_accepted_tokens": 20,
        "num_output_tokens": 90,
        "acceptance_length": 3.0,
    }


def test_rollout_summary_of_nothing_and_of_records_without_finishes():
    assert rollout_summary([]) == {} and rollout_summary([None, None]) == {}
    summary = rollout_summary([record(0, 7.0, 9.0, [], [], sd())])
    assert summary == {
        "start": 7.0,
        "last_finish": 7.0,
        "closed": 9.0,
        "num_responses": 0,
        **sd(),
    }  # no acceptance_length


def test_rollout_summary_adds_engine_busy_time_and_the_last_arrival_when_every_record_has_them():
    busy = [
        {**record(0, 100.0, 112.0, [101.0], [10], sd()), "submit_times": [100.0, 100.5], "engine_busy_s": 0.75},
        {**record(1, 100.2, 111.0, [102.0], [20], sd()), "submit_times": [100.2, 103.0], "engine_busy_s": 1.5},
    ]
    summary = rollout_summary(busy)
    assert summary["engine_busy_s"] == 2.25 and summary["last_submit"] == 103.0
    metrics = rollout_metrics(busy, [])
    assert metrics["tlt/rollout/engine_busy_s"] == 2.25 and metrics["tlt/rollout/last_submit_s"] == 3.0
    mixed = rollout_summary([busy[0], record(2, 100.0, 110.0, [105.0], [5], sd())])  # an older record lacks them
    assert "engine_busy_s" not in mixed and "last_submit" not in mixed


def test_append_jsonl_creates_the_directory_and_appends_one_line_per_record(tmp_path):
    path = tmp_path / "traces" / "deep" / "rollouts.jsonl"
    first = record(0, 1.0, 2.0, [1.5], [4], sd(verify=1))
    append_jsonl(path, first)
    append_jsonl(str(path), {"replica": 1, "extra": [1, 2]})
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [first, {"replica": 1, "extra": [1, 2]}]


# ----- weights checksum ------------------------------------------------------------------------------------------


def _linear_pair(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def test_weights_checksum_is_equal_for_bitwise_copies_and_changes_with_one_ulp():
    model, copy = _linear_pair(), _linear_pair()
    assert weights_sha256(model) == weights_sha256(copy)
    with torch.no_grad():  # the smallest change a float can make: the next representable value of one weight
        weight = copy[1].weight
        weight[0, 0] = torch.nextafter(weight[0, 0], torch.tensor(float("inf")))
    assert weights_sha256(model) != weights_sha256(copy)


def test_weights_checksum_tells_apart_a_different_dtype_and_swapped_parameters():
    model = _linear_pair()
    assert weights_sha256(model) != weights_sha256(_linear_pair().to(torch.bfloat16))
    swapped = _linear_pair()
    with torch.no_grad():  # same multiset of bytes, different places: names are part of the digest
        swapped[0].bias.copy_(model[0].bias.flip(0))
    assert weights_sha256(model) != weights_sha256(swapped)


def test_rollout_checksum_is_the_replicas_common_one_and_none_when_any_lacks_it_or_they_disagree():
    a, b = {"weights_sha256": "aa"}, {"weights_sha256": "bb"}
    assert rollout_weights_sha256([a, None, dict(a)]) == "aa"
    assert rollout_weights_sha256([a, b]) is None
    assert rollout_weights_sha256([a, {"replica": 1}]) is None
    assert rollout_weights_sha256([]) is None


def test_records_are_numbered_by_rollout():
    trace = RolloutTrace(0, clock=lambda: 1.0)
    assert trace.close() is None  # nothing submitted: no record, and no number used
    indices = []
    for _ in range(3):
        trace.on_submit()
        trace.on_finish(4, {})
        indices.append(trace.close()["rollout_index"])
    assert indices == [0, 1, 2]


def test_a_validation_record_is_marked_and_takes_no_rollout_index():
    trace = RolloutTrace(0, clock=lambda: 1.0)
    trace.on_submit()
    trace.on_finish(4, {"num_verify_steps": 2})
    validation = trace.close(validation=True)
    assert validation["validation"] is True and validation["rollout_index"] is None
    assert validation["sd"]["num_verify_steps"] == 2
    trace.on_submit()
    training = trace.close()
    assert training["validation"] is False and training["rollout_index"] == 0
    assert training["finish_times"] == [] and training["sd"]["num_verify_steps"] == 0
