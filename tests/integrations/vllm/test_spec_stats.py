"""vLLM's per-step spec-decode stats become the torch engine's counters (pure, no vLLM needed)."""

from __future__ import annotations

from verl_tlt.integrations.vllm.spec_stats import SpecStepCounter
from verl_tlt.metrics.decode_metrics import strategy_acceptance
from verl_tlt.metrics.rollout_trace import acceptance_length
from verl_tlt.policy import SpeculationGate


def test_steps_with_drafts_are_speculative_and_labelled_by_the_rows_they_verified():
    counter = SpecStepCounter(SpeculationGate(threshold=4, buckets=(1, 2, 4)))
    counter.record_step(num_running=8, generated_tokens=8)  # above the threshold: plain
    counter.record_step(
        num_running=3,
        generated_tokens=10,
        num_drafts=3,
        num_draft_tokens=12,
        num_accepted=7,
        accepted_per_position=[3, 2, 1, 1],
    )
    counter.record_step(
        num_running=1,
        generated_tokens=5,
        num_drafts=1,
        num_draft_tokens=4,
        num_accepted=4,
        accepted_per_position=[1, 1, 1, 1],
    )
    counter.record_step(num_running=0, generated_tokens=0)  # nothing decoded: not a step
    stats = counter.take_stats()
    assert (stats["steps_plain"], stats["steps_sd"]) == (1, 2)
    assert (stats["tokens_plain"], stats["tokens_sd"]) == (8, 15)
    assert stats["strategy_histogram"] == {
        "above_threshold": {"plain": 1},
        "bs>=2": {"4_1_4": 1},
        "bs>=1": {"4_1_4": 1},
    }
    assert stats["max_sd_rows"] == 3
    assert stats["accepted_per_position"] == [4, 3, 2, 2]
    assert strategy_acceptance([stats]) == {"4_1_4": 15 / 4}
    assert counter.take_stats()["steps_sd"] == 0  # reset by the take


def test_rollout_totals_give_the_acceptance_length_and_reset():
    counter = SpecStepCounter(SpeculationGate(threshold=4, buckets=(1,)))
    counter.record_step(num_running=2, generated_tokens=9, num_drafts=2, num_draft_tokens=8, num_accepted=7)
    totals = counter.take_totals()
    assert totals == {"num_verify_steps": 2, "num_draft_tokens": 8, "num_accepted_tokens": 7, "num_output_tokens": 9}
    assert acceptance_length(totals) == 4.5
    assert counter.take_totals()["num_verify_steps"] == 0


def test_steps_recorded_while_probing_reach_the_tally_and_not_the_rollouts_stats():
    counter = SpecStepCounter(SpeculationGate(threshold=4, buckets=(1,)))
    counter.record_step(num_running=1, generated_tokens=3, num_drafts=1, num_draft_tokens=4, num_accepted=2)
    with counter.probing() as tally:
        counter.record_step(num_running=1, generated_tokens=1)  # the probe's prefill
        counter.record_step(num_running=1, generated_tokens=5, num_drafts=1, num_draft_tokens=4, num_accepted=4)
        counter.record_step(num_running=1, generated_tokens=2, num_drafts=1, num_draft_tokens=4, num_accepted=1)
    counter.record_step(num_running=1, generated_tokens=2, num_drafts=1, num_draft_tokens=4, num_accepted=1)
    assert (tally.drafted, tally.accepted) == (8, 5)
    stats, totals = counter.take_stats(), counter.take_totals()
    assert (stats["steps_plain"], stats["steps_sd"], stats["tokens_sd"]) == (0, 2, 5)
    assert totals == {"num_verify_steps": 2, "num_draft_tokens": 8, "num_accepted_tokens": 3, "num_output_tokens": 5}
