"""The cost model: interpolated step costs, acceptance from a probe and from steps, and the policy that uses them
from its first step."""

from __future__ import annotations

import random

import pytest

from verl_tlt.config import SpeculativeConfig
from verl_tlt.policy.adaptive import (
    MAX_UNPAID_PROBE_HALVINGS,
    PLAIN,
    PREDICTED_MARGIN,
    PROBE_SD_STEPS,
    AdaptivePolicy,
)
from verl_tlt.policy.cost_model import CostModel, StepCostTable, alpha_for, expected_tokens
from verl_tlt.spec.strategy import SpecStrategy

STRATEGIES = ("8_4_16", "6_4_8", "4_1_4", "2_1_2")
# Step seconds of the shape measured for SmolLM2-135M on a 2-core CPU (plain 47 ms at batch 1; a chain of 4 about
# three plain steps; trees dearer and growing faster with the batch).
RECORDED = StepCostTable(
    {
        PLAIN: {1: 0.047, 4: 0.060, 16: 0.095},
        "2_1_2": {1: 0.100, 4: 0.130, 16: 0.210},
        "4_1_4": {1: 0.160, 4: 0.200, 16: 0.350},
        "6_4_8": {1: 0.220, 4: 0.320, 16: 0.650},
        "8_4_16": {1: 0.320, 4: 0.520, 16: 1.250},
    }
)


def strategies() -> dict[str, SpecStrategy]:
    return {name: SpecStrategy.parse(name) for name in STRATEGIES}


def model(alpha: float | None) -> CostModel:
    return CostModel(RECORDED, strategies(), prior_alpha=alpha)


def test_step_costs_interpolate_between_the_batch_sizes_timed():
    assert RECORDED.at(PLAIN, 1) == 0.047 and RECORDED.at(PLAIN, 0) == 0.047
    assert RECORDED.at(PLAIN, 10) == pytest.approx(0.060 + (0.095 - 0.060) * 6 / 12)
    assert RECORDED.at(PLAIN, 28) == pytest.approx(0.095 + (0.095 - 0.060) / 12 * 12)  # extended past the last
    assert RECORDED.at("3_1_3", 4) is None
    assert StepCostTable({PLAIN: {4: 0.05}}).at(PLAIN, 16) == 0.05  # one size: flat


def test_a_table_without_plain_or_with_bad_seconds_is_refused():
    with pytest.raises(ValueError, match="plain decoding"):
        StepCostTable({"4_1_4": {1: 0.1}})
    with pytest.raises(ValueError, match="seconds > 0"):
        StepCostTable({PLAIN: {1: 0.0}})


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.75, 0.95])
def test_acceptance_and_alpha_invert_each_other(name, alpha):
    strategy = SpecStrategy.parse(name)
    tokens = expected_tokens(strategy, alpha)
    assert 1.0 <= tokens <= strategy.depth + 1
    assert alpha_for(strategy, tokens) == pytest.approx(alpha, abs=1e-6)


def test_a_chains_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(SpecStrategy.parse("4_1_4"), 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)
    assert expected_tokens(SpecStrategy.parse("4_1_4"), 1.0) == 5.0


def test_rates_are_committed_tokens_per_request_second():
    costs = model(0.5)
    assert costs.predicted_rate(PLAIN, 1) == pytest.approx(1 / 0.047)
    assert costs.predicted_rate("4_1_4", 1) == pytest.approx(expected_tokens(SpecStrategy.parse("4_1_4"), 0.5) / 0.16)
    assert model(None).predicted_rate("4_1_4", 1) is None  # no acceptance known yet
    assert not model(None).behind_plain("4_1_4", 1, 0.1)  # unknown is not behind


def test_steps_refine_the_acceptance_and_the_costs():
    costs = model(0.3)
    for _ in range(50):  # a 4-chain that commits 4 tokens a row: the drafter is far better than its probe said
        costs.observe("4_1_4", 2, committed_tokens=8, seconds=0.18 * 1.5)
    assert costs.alpha > 0.7
    assert costs.arm_factors["4_1_4"] > 1.3  # its steps took longer than timed
    for _ in range(50):  # plain steps at real contexts take twice the timed seconds: every arm's prediction follows
        costs.observe(PLAIN, 4, committed_tokens=4, seconds=0.120)
    assert costs.context_factor == pytest.approx(2.0, rel=0.05)
    assert costs.predicted_seconds("2_1_2", 4) == pytest.approx(0.130 * costs.context_factor)
    costs.new_drafter(0.2)  # a new drafter: its acceptance starts over from its probe
    assert costs.alpha == pytest.approx(0.2)


def policy_config(**overrides) -> SpeculativeConfig:
    base = {"threshold": 32, "buckets": (1, 4, 16), "strategies": STRATEGIES, "plain_arm_min_batch": 1}
    return SpeculativeConfig(**{**base, **overrides})


def run(policy: AdaptivePolicy, batch_size: int, steps: int, alpha: float, seed: int = 0) -> list[str]:
    """Steps whose seconds are the recorded costs and whose tokens follow `alpha` (rounded, per row)."""
    rng, chosen = random.Random(seed), []
    for _ in range(steps):
        strategy = policy.select(batch_size)
        name = PLAIN if strategy is None else strategy.name
        tokens = batch_size if strategy is None else round(batch_size * expected_tokens(strategy, alpha))
        seconds = RECORDED.at(name, batch_size) * (1 + 0.05 * rng.gauss(0, 1))
        policy.observe(strategy, batch_size, tokens, seconds)
        chosen.append(name)
    return chosen


@pytest.mark.parametrize("batch_size", [1, 4, 16])
def test_a_drafter_that_never_pays_leaves_plain_from_the_first_step_and_its_probes_back_off(batch_size):
    policy = AdaptivePolicy(policy_config(probe_rate=0.02), model(0.3))  # a 4-chain commits 1.4 tokens a row
    assert policy.cannot_pay() is not None and "alpha=0.30" in policy.cannot_pay()
    chosen = run(policy, batch_size, 4000, alpha=0.3)
    assert chosen[0] == PLAIN
    # Only probes speculate, never the bandit's first plays; every plain step was one where nothing was predicted to
    # pay (probes from plain mode are SD steps).
    assert policy.num_probes > 0 and policy.unpaid_plain_steps == chosen.count(PLAIN)
    # Each probe halves the next one's chance, down to probe_rate / 2**MAX_UNPAID_PROBE_HALVINGS: after the first
    # few, about 4000 x 0.02 / 16 = 5 probes, where the full rate would take about 80.
    assert policy.unpaid_probes == policy.num_probes and 4 <= policy.num_probes <= 30
    sd_steps = sum(name != PLAIN for name in chosen)
    assert sd_steps == PROBE_SD_STEPS * policy.num_probes


def test_probes_of_a_drafter_that_cannot_pay_return_to_the_full_rate_once_one_may_pay():
    policy = AdaptivePolicy(policy_config(probe_rate=0.02), model(0.3))
    run(policy, 1, 3000, alpha=0.3)
    assert policy.unpaid_probes >= MAX_UNPAID_PROBE_HALVINGS
    policy.new_drafter(0.25)  # a new version that still cannot pay: the probes stay backed off
    assert policy.cannot_pay() is not None and policy.unpaid_probes >= MAX_UNPAID_PROBE_HALVINGS
    policy.new_drafter(0.9)  # one that may pay: probed (and played) as any drafter
    assert policy.cannot_pay() is None and policy.unpaid_probes == 0


def test_probes_still_find_a_drafter_its_self_test_underrated():
    """The probe said 0.3 (cannot pay); the drafter really accepts 0.9: the backed-off probes' observed steps still
    lift the pooled acceptance until the drafter is played."""
    policy = AdaptivePolicy(policy_config(probe_rate=0.02), model(0.3))
    chosen = run(policy, 1, 6000, alpha=0.9)
    assert chosen[-500:].count(PLAIN) / 500 < 0.5


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_drafter_that_pays_speculates_from_the_first_eligible_step_with_the_predicted_best(batch_size):
    policy = AdaptivePolicy(policy_config(), model(0.9))
    assert policy.cannot_pay() is None
    first = run(policy, batch_size, 1, alpha=0.9)[0]
    rates = {name: policy.predicted_rate(name, policy.bucket_of(batch_size)) for name in (*STRATEGIES, PLAIN)}
    assert first != PLAIN and first == max(rates, key=rates.get)
    later = run(policy, batch_size, 400, alpha=0.9, seed=1)
    assert later[100:].count(PLAIN) / 300 < 0.1


def test_an_arm_predicted_behind_is_not_played_first_but_close_ones_are():
    # alpha 0.6 at batch 1: the 2-chain is within the margin of plain, the longer chain and the trees far behind.
    policy = AdaptivePolicy(policy_config(), model(0.6))
    bucket = 1
    behind = {name for name in STRATEGIES if policy.costs.behind_plain(name, bucket, PREDICTED_MARGIN)}
    assert behind and behind != set(STRATEGIES)
    chosen = run(policy, bucket, 30, alpha=0.6)
    assert "2_1_2" in chosen[:8] and not behind & set(chosen[:30])


def test_a_better_drafter_version_is_taken_up():
    policy = AdaptivePolicy(policy_config(), model(0.3))
    assert set(run(policy, 1, 50, alpha=0.3)[5:]) <= {PLAIN} | set(STRATEGIES)
    policy.new_drafter(0.9)  # its self-test probe scored 0.9
    assert policy.cannot_pay() is None
    later = run(policy, 1, 300, alpha=0.9, seed=2)
    assert later[50:].count(PLAIN) / 250 < 0.15


def test_without_costs_every_arm_is_played_first_as_before():
    policy = AdaptivePolicy(policy_config())
    chosen = run(policy, 1, 10, alpha=0.3)
    assert set(chosen[:10]) >= {"8_4_16", "6_4_8", "4_1_4", "2_1_2"} and policy.cannot_pay() is None
