"""The rollout model on cases whose answers are known by hand."""

from __future__ import annotations

import random

import pytest

from verl_tlt.config import SpeculativeConfig
from verl_tlt.policy.adaptive import AdaptivePolicy
from verl_tlt.sim.acceptance import committed_tokens, expected_committed
from verl_tlt.sim.costs import LinearCost, SpeculativeCost
from verl_tlt.sim.rollout import simulate_rollout
from verl_tlt.spec.strategy import SpecStrategy

ONE_SECOND = SpeculativeCost(LinearCost(fixed_s=1.0))


class FixedPolicy:
    """Speculate with one strategy at or below a batch size; record what it was told."""

    def __init__(self, strategy: str, threshold: int = 1000):
        self.strategy, self.threshold, self.observed = SpecStrategy.parse(strategy), threshold, []

    def select(self, batch_size):
        return self.strategy if batch_size <= self.threshold else None

    def observe(self, strategy, batch_size, committed_tokens, seconds):
        self.observed.append((None if strategy is None else strategy.name, batch_size, committed_tokens, seconds))


def test_one_replica_plain_decoding_takes_one_step_per_token_of_the_longest_answer():
    result = simulate_rollout([1, 2, 4], ONE_SECOND)
    assert result.time_s == 4.0 and result.finish_s == [1.0, 2.0, 4.0]
    assert [(step.batch, step.count) for step in result.replicas[0].steps] == [(3, 1), (2, 1), (1, 2)]
    assert result.idle_replica_s == 0.0


def test_step_cost_grows_with_the_batch():
    cost = SpeculativeCost(LinearCost(fixed_s=1.0, per_token_s=0.1))
    assert simulate_rollout([1, 2, 4], cost).time_s == pytest.approx(1.3 + 1.2 + 1.1 + 1.1)


def test_replicas_decode_their_share_in_parallel_and_the_drained_one_idles():
    result = simulate_rollout([4, 1, 4, 1], ONE_SECOND, replicas=2)  # round robin: [4, 4] and [1, 1]
    assert result.time_s == 4.0
    assert [r.drained_s for r in result.replicas] == [4.0, 1.0]
    assert result.idle_replica_s == 3.0


def test_max_num_seqs_makes_requests_wait_for_a_slot():
    result = simulate_rollout([2, 3], ONE_SECOND, max_num_seqs=1)
    assert result.finish_s == [2.0, 5.0]


def test_a_perfect_drafter_commits_depth_plus_one_tokens_per_step():
    cost = SpeculativeCost(LinearCost(fixed_s=1.0, per_token_s=0.1), drafter_fraction=0.25)
    policy = FixedPolicy("3_1_3")
    result = simulate_rollout([8], cost, policy_factory=lambda: policy, acceptance=1.0)
    step = 3 * 0.25 * 1.1 + (1.0 + 0.1 * 4)  # three drafter steps, then a verify of 4 tokens
    assert result.time_s == pytest.approx(2 * step)
    assert [o[2] for o in policy.observed] == [4, 4]


def test_model_free_drafts_cost_no_drafter_steps():
    cost = SpeculativeCost(LinearCost(fixed_s=1.0), drafter_fraction=0.5)
    with_model = simulate_rollout([8], cost, policy_factory=lambda: FixedPolicy("3_1_3"), acceptance=1.0)
    model_free = simulate_rollout([8], cost, policy_factory=lambda: FixedPolicy("suffix:3_1_3"), acceptance=1.0)
    assert with_model.time_s == pytest.approx(2 * (1.5 + 1.0)) and model_free.time_s == pytest.approx(2 * 1.0)


def test_acceptance_per_source_and_speculation_only_in_the_tail():
    policy = FixedPolicy("suffix:3_1_3", threshold=1)
    result = simulate_rollout([1, 9], ONE_SECOND, policy_factory=lambda: policy, acceptance={"suffix": 1.0})
    # Step 1 plain at batch 2 (both commit 1; the first finishes), then batch 1 speculates: 4 tokens a step.
    assert [s.arm for s in result.replicas[0].steps] == ["plain", "suffix:3_1_3", "suffix:3_1_3"]
    assert result.finish_s == [1.0, 3.0]


def test_expected_and_drawn_committed_tokens_agree():
    assert expected_committed(0.0, 4) == 1.0 and expected_committed(1.0, 4) == 5.0
    assert expected_committed(0.5, 2) == pytest.approx(1.75)
    rng = random.Random(0)
    draws = [committed_tokens(0.8, 4, rng) for _ in range(20000)]
    assert sum(draws) / len(draws) == pytest.approx(expected_committed(0.8, 4), rel=0.02)
    assert min(draws) == 1 and max(draws) == 5


def test_the_projects_adaptive_policy_decides_each_step():
    config = SpeculativeConfig(threshold=4, strategies=("4_1_4",), plain_arm_min_batch=1000, min_dwell_steps=0)
    result = simulate_rollout(
        [200] * 8,
        SpeculativeCost(LinearCost(fixed_s=1.0, per_token_s=0.01), drafter_fraction=0.1),
        replicas=2,
        policy_factory=lambda: AdaptivePolicy(config),
        acceptance=0.8,
    )
    arms = {step.arm for replica in result.replicas for step in replica.steps}
    assert arms == {"4_1_4"}  # 4 requests per replica: at the threshold from the first step on
    assert result.time_s < 200 * 1.04  # plain decoding would take 200 steps of at least 1.04 s


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"replicas": 0}, "replicas"), ({"max_num_seqs": 0}, "max_num_seqs")],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        simulate_rollout([1], ONE_SECOND, **kwargs)


def test_bad_costs_and_lengths_are_refused():
    with pytest.raises(ValueError, match="response length"):
        simulate_rollout([0], ONE_SECOND)
    with pytest.raises(ValueError, match="LinearCost"):
        LinearCost(fixed_s=0.0)
    with pytest.raises(ValueError, match="alpha"):
        expected_committed(1.5, 2)


def test_a_replica_waits_for_requests_that_have_not_arrived():
    from verl_tlt.sim.rollout import PolicySteps, simulate_replica

    timeline, finish = simulate_replica([2, 2], PolicySteps(ONE_SECOND), arrivals=[0.0, 5.0])
    assert finish == [2.0, 7.0] and timeline.drained_s == 7.0


def test_a_prefill_step_emits_each_admitted_requests_first_token():
    from verl_tlt.sim.rollout import PolicySteps, simulate_replica

    timeline, finish = simulate_replica([1, 3], PolicySteps(ONE_SECOND), prefill_s=0.5)
    assert finish == [0.5, 2.5]  # the prefill (0.5 s) gives both a token; two decode steps finish the second
    assert [(s.arm, s.batch, s.count) for s in timeline.steps] == [("prefill", 2, 1), ("plain", 1, 2)]
    timeline, finish = simulate_replica([2, 2], PolicySteps(ONE_SECOND), arrivals=[0.0, 0.7], prefill_s=0.5)
    # 0-0.5 prefill of the first; 0.5-1.5 its second token; the second arrived at 0.7, prefilled 1.5-2.0, decoded.
    assert finish == [1.5, 3.0]


class Unsteady:
    """Plain steps priced like a cost model, without the `steady` hint: the replica takes them one at a time."""

    def __init__(self, cost):
        self.cost = cost

    def step(self, batch, kv_tokens=0):
        return self.cost.plain_seconds(batch, kv_tokens), 1.0, "plain"

    def observe(self, batch, committed, seconds):
        pass


def test_steps_taken_at_once_cost_what_they_cost_one_by_one():
    from verl_tlt.sim.rollout import PolicySteps, simulate_replica

    cost = SpeculativeCost(LinearCost(fixed_s=1.0, per_token_s=0.1, per_kv_token_s=0.01))
    lengths, prompts = [5, 40, 17, 17, 90], [3, 7, 1, 0, 12]
    fast, fast_finish = simulate_replica(lengths, PolicySteps(cost), prompt_tokens=prompts, max_num_seqs=3)
    slow, slow_finish = simulate_replica(lengths, Unsteady(cost), prompt_tokens=prompts, max_num_seqs=3)
    assert fast_finish == pytest.approx(slow_finish) and fast.drained_s == pytest.approx(slow.drained_s)
    assert len(fast.steps) < len(slow.steps) == sum(step.count for step in fast.steps)


def test_the_kv_cache_grows_by_a_token_per_row_and_step():
    cost = SpeculativeCost(LinearCost(fixed_s=1.0, per_kv_token_s=0.5))
    # One request, prompt 4: steps read 4, 5, 6 cached tokens.
    result = simulate_rollout([3], cost, prompt_tokens=4)
    assert result.time_s == pytest.approx(3 + 0.5 * (4 + 5 + 6))


def test_rows_that_commit_different_counts_finish_when_their_own_tokens_are_done():
    from verl_tlt.sim.rollout import simulate_replica

    class Alternating:
        """Row order by request id: request 0 commits 3 a step, request 1 commits 1."""

        def step(self, batch, kv_tokens=0):
            return 1.0, ([3.0, 1.0] if batch == 2 else [1.0]), "x"

        def observe(self, *args):
            pass

    timeline, finish = simulate_replica([6, 4], Alternating())
    assert finish == [2.0, 4.0]  # request 0: 3 + 3; request 1: 1 + 1, then alone 1 + 1
