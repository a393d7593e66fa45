"""The scheduler's bookkeeping: admission within max_num_seqs, compact slots on retirement, aborts."""

from __future__ import annotations

import pytest

from verl_tlt.engine.request import Request
from verl_tlt.engine.sampling_params import SamplingParams
from verl_tlt.engine.scheduler import Scheduler


def _request(scheduler: Scheduler, prompt_len: int) -> Request:
    request = Request(scheduler.new_request_id(), [1] * prompt_len, SamplingParams(max_tokens=4), None, 64)
    scheduler.enqueue(request, lambda r: None)
    return request


def test_admission_takes_the_oldest_waiting_requests_up_to_max_num_seqs():
    scheduler = Scheduler(max_num_seqs=2)
    requests = [_request(scheduler, n) for n in (3, 4, 5)]
    admitted = scheduler.admit()
    assert admitted == requests[:2]
    scheduler.start(admitted)
    assert scheduler.cache_lens == [3, 4] and scheduler.admit() == []
    assert list(scheduler.waiting) == requests[2:]


def test_retirement_moves_the_last_running_request_into_each_freed_slot():
    scheduler = Scheduler(max_num_seqs=4)
    requests = [_request(scheduler, n) for n in (3, 4, 5, 6)]
    scheduler.start(scheduler.admit())
    requests[0].finish_reason = requests[2].finish_reason = "stop"
    moves, retired = [], []
    outputs = scheduler.retire_finished(lambda src, dst, n: moves.append((src, dst, n)), retired.append)
    assert [o.request_id for o in outputs] == [requests[0].request_id, requests[2].request_id]
    assert retired == [requests[0], requests[2]]
    # slot 0 takes the last request (6 tokens); then slot 2 is the last slot, so nothing moves into it
    assert moves == [(3, 0, 6)]
    assert scheduler.running == [requests[3], requests[1]] and scheduler.cache_lens == [6, 4]


def test_abort_finishes_a_waiting_request_now_and_marks_a_running_one():
    scheduler = Scheduler(max_num_seqs=1)
    running, waiting = _request(scheduler, 3), _request(scheduler, 3)
    scheduler.start(scheduler.admit())
    scheduler.abort(running.request_id)
    scheduler.abort(waiting.request_id)
    outputs = scheduler.collect_aborted()
    assert [(o.request_id, o.finish_reason) for o in outputs] == [(waiting.request_id, "abort")]
    assert running.finish_reason == "abort" and not scheduler.waiting
    scheduler.reset()
    assert not scheduler.has_unfinished()


def test_max_num_seqs_must_be_positive():
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        Scheduler(max_num_seqs=0)
