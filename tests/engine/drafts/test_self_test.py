"""The drafter's self-test: the verdict against the last passing drafter, probes served on the engine without
touching what the rollouts sample, and the refusal of a broken drafter."""

from __future__ import annotations

from tests.engine.drafters import HFModelDrafter
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.drafts.self_test import (
    MIN_REFERENCE_RATE,
    PROBE_POSITIONS,
    PROBE_PROMPTS,
    DrafterSelfTest,
    ProbeScore,
    continue_greedily,
    cut_points,
    judge,
    probe_acceptance,
)

PROMPTS = [[5, 6, 7], [10, 11], [12]]


def score(rate: float, error: str | None = None) -> ProbeScore:
    return ProbeScore(drafted=100, accepted=round(100 * rate), seconds=0.1, drafter_error=error)


def test_judge_refuses_only_far_below_a_meaningful_reference():
    assert judge(score(0.0), reference=None, min_ratio=0.5) is None  # nothing to compare with yet
    assert judge(score(0.0), reference=MIN_REFERENCE_RATE / 2, min_ratio=0.5) is None  # an untrained reference
    assert judge(score(0.3), reference=0.6, min_ratio=0.5) is None  # drifted, not broken
    reason = judge(score(0.29), reference=0.6, min_ratio=0.5)
    assert reason is not None and "29.0%" in reason and "60.0%" in reason
    assert "failed on the probe (RuntimeError: boom)" in judge(score(0.9, "RuntimeError: boom"), None, 0.5)


def test_cut_points_spread_over_the_answer():
    assert PROBE_POSITIONS == 16
    assert cut_points(answer_start=10, length=26) == list(range(10, 26))  # as many answer tokens as cut points
    assert cut_points(answer_start=10, length=41) == [10 + 2 * i for i in range(15)] + [40]  # first to last
    assert cut_points(answer_start=10, length=13) == [10, 11, 12]  # fewer answer tokens than cut points
    assert cut_points(answer_start=10, length=10) == []


def make_engine(varied_qwen2, drafter=None) -> RolloutEngine:
    return RolloutEngine.from_pretrained(str(varied_qwen2[0]), drafter=drafter, max_num_seqs=4)


def test_a_perfect_drafter_passes_and_an_adversarial_one_is_refused(varied_qwen2):
    engine = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1]))
    test = DrafterSelfTest(tokens=12, min_ratio=0.5, max_model_len=engine.max_model_len)
    assert test.check(engine).passed and test.check(engine).score is None  # no probes yet: skipped
    for prompt in PROMPTS:
        test.remember(prompt)
    assert test.probes == PROMPTS[:PROBE_PROMPTS]
    verdict = test.check(engine)
    assert verdict.passed and verdict.score.rate == 1.0 and test.reference == 1.0
    engine.set_drafter(HFModelDrafter(varied_qwen2[1], sign=-1.0))
    verdict = test.check(engine)
    assert not verdict.passed and verdict.score.rate == 0.0 and "0.0% of its probe draft tokens" in verdict.reason
    assert test.reference == 1.0  # a refused drafter does not become the reference
    counts = test.take()
    assert (counts["runs"], counts["refused"], counts["last_rate"]) == (2, 1, 0.0)
    assert test.take()["runs"] == 0  # taking starts afresh


def test_probes_are_distinct_prompts_that_leave_room_for_the_probe():
    test = DrafterSelfTest(tokens=8, min_ratio=0.5, max_model_len=12)
    test.remember([1, 2, 3, 4, 5])  # 5 + 8 > 12: no room
    test.remember([1, 2])
    test.remember([1, 2])
    test.remember([3])
    test.remember([4])
    assert test.probes == [[1, 2], [3], [4]][:PROBE_PROMPTS]  # the first distinct prompts with room
    off = DrafterSelfTest(tokens=0, min_ratio=0.5, max_model_len=12)
    off.remember([1, 2])
    assert not off.enabled and off.probes == []


def test_a_probe_changes_nothing_the_rollouts_sample_or_count(varied_qwen2):
    """Unseeded sampled requests draw their noise keys from the engine's generator in arrival order: a probe between
    two rollouts must draw nothing from it, and its steps must not reach the rollout's counters."""
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    plain = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1]))
    probed = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1]))
    first = [o.token_ids for o in plain.generate(PROMPTS, params, strategy="3_1_3")]
    assert [o.token_ids for o in probed.generate(PROMPTS, params, strategy="3_1_3")] == first
    before = (probed.stats.as_dict(), probed.decode_costs.costs)
    sequences = continue_greedily(probed, PROMPTS[:2], tokens=8)
    assert [len(s) for s in sequences] == [len(p) + 8 for p in PROMPTS[:2]]
    score = probe_acceptance(probed, sequences, [len(p) for p in PROMPTS[:2]])
    assert score.drafted == 2 * 8 and score.accepted == score.drafted  # 8 answer tokens each; a perfect drafter
    assert (probed.stats.as_dict(), probed.decode_costs.costs) == before
    second = [o.token_ids for o in plain.generate(PROMPTS, params, strategy="3_1_3")]
    assert [o.token_ids for o in probed.generate(PROMPTS, params, strategy="3_1_3")] == second


def test_a_drafter_that_raises_on_the_probe_is_refused(varied_qwen2):
    class Broken(HFModelDrafter):
        def begin(self, rows):
            raise RuntimeError("boom")

    engine = make_engine(varied_qwen2, Broken(varied_qwen2[1]))
    test = DrafterSelfTest(tokens=6, min_ratio=0.5, max_model_len=engine.max_model_len)
    test.remember(PROMPTS[0])
    verdict = test.check(engine)
    assert not verdict.passed and "RuntimeError: boom" in verdict.reason


def test_an_off_self_test_never_probes(varied_qwen2):
    engine = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1], sign=-1.0))
    test = DrafterSelfTest(tokens=0, min_ratio=0.5, max_model_len=engine.max_model_len)
    test.remember(PROMPTS[0])
    assert test.check(engine).score is None and test.take()["runs"] == 0
