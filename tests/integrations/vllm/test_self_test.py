"""The vLLM replica's drafter self-test, driven by a fake probe request (pure: no vLLM needed)."""

from __future__ import annotations

import asyncio

from verl_tlt.engine.drafts.self_test import DrafterSelfTest
from verl_tlt.integrations.vllm.self_test import probe_vllm_drafter
from verl_tlt.integrations.vllm.spec_stats import SpecStepCounter
from verl_tlt.policy import SpeculationGate

PROMPT = [5, 6, 7]


def probe_accepting(counter: SpecStepCounter, accepted: int, drafted: int = 16, calls: list | None = None):
    """A request that 'runs' on an engine whose steps verify `drafted` tokens and accept `accepted` of them."""

    async def request(prompt_ids: list[int], tokens: int) -> None:
        if calls is not None:
            calls.append((prompt_ids, tokens))
        if drafted:
            counter.record_step(1, accepted + 1, num_drafts=1, num_draft_tokens=drafted, num_accepted=accepted)

    return request


def check(test, counter, request):
    return asyncio.run(probe_vllm_drafter(test, counter, request))


def test_the_probe_is_the_first_prompt_served_and_a_drafter_far_below_the_last_passing_one_is_refused():
    counter = SpecStepCounter(SpeculationGate(threshold=4, buckets=(1,)))
    test = DrafterSelfTest(tokens=32, min_ratio=0.5, max_model_len=1024)
    calls = []
    assert check(test, counter, probe_accepting(counter, 12, calls=calls)).score is None  # nothing served yet
    test.remember(PROMPT)
    test.remember([9, 9])
    good = check(test, counter, probe_accepting(counter, 12, calls=calls))
    assert good.passed and good.score.rate == 12 / 16 and calls == [(PROMPT, 32)]
    bad = check(test, counter, probe_accepting(counter, 2))
    assert not bad.passed and "below 0.5 x the last passing drafter's 75.0%" in bad.reason
    assert check(test, counter, probe_accepting(counter, 10)).passed  # the reference stayed the passing drafter's
    assert test.take() | {"seconds": 0} == {
        "runs": 3,
        "refused": 1,
        "seconds": 0,
        "last_rate": 10 / 16,
        "last_reason": bad.reason,
    }
    assert counter.take_totals()["num_draft_tokens"] == 0  # the probes never reached the rollout's counters


def test_a_probe_with_no_drafts_is_no_evidence_and_a_failing_engine_is_refused():
    counter = SpecStepCounter(SpeculationGate(threshold=4, buckets=(1,)))
    test = DrafterSelfTest(tokens=8, min_ratio=0.5, max_model_len=1024)
    test.remember(PROMPT)
    skipped = check(test, counter, probe_accepting(counter, 0, drafted=0))  # the policy chose plain decoding
    assert skipped.passed and skipped.score is None and test.runs == 0

    async def broken(prompt_ids, tokens):
        raise RuntimeError("engine step failed")

    verdict = check(test, counter, broken)
    assert not verdict.passed and "RuntimeError: engine step failed" in verdict.reason


def test_a_switched_off_test_never_probes():
    counter = SpecStepCounter(SpeculationGate(threshold=4, buckets=(1,)))
    test = DrafterSelfTest(tokens=0, min_ratio=0.5, max_model_len=1024)
    test.remember(PROMPT)
    calls = []
    assert check(test, counter, probe_accepting(counter, 1, calls=calls)).score is None and calls == []


def test_a_refused_version_falls_back_to_the_last_tested_one_and_only_unneeded_exports_go(tmp_path):
    from verl_tlt.integrations.vllm.self_test import DrafterExports

    initial, v1, v2, v3 = (tmp_path / name for name in ("initial", "v1", "v2", "v3"))
    exports = DrafterExports(initial, -1)
    assert exports.loaded(v1, 1) == []  # the start-up drafter is the fallback while v1 is untested
    assert exports.tested(passed=True) == (None, [initial])  # v1 passed: the fallback's files can go
    assert exports.loaded(v2, 2) == []
    assert exports.loaded(v3, 3) == [v2]  # v2 never ran a rollout; v1, the last tested one, stays
    assert exports.tested(passed=False) == ((v1, 1), [v3])  # v3 refused: back to v1
    assert (exports.folder, exports.version) == (v1, 1)
    assert exports.tested(passed=False) == (None, [])  # v1 failing again: nothing to fall back to (the server reloads)
    assert exports.tested(passed=True) == (None, [])
