"""The adaptive policy: plain above the threshold, bandits that find the best arm per bucket, bounded flapping."""

from __future__ import annotations

import random

import pytest

from verl_tlt.config import SpeculativeConfig
from verl_tlt.policy.adaptive import MAX_STALE_DOUBLINGS, PLAIN, STALE_FACTOR, AdaptivePolicy

STRATEGIES = ("8_4_16", "6_4_8", "4_1_4")
# Synthetic environment: per-request tokens/s of each arm in each bucket (the best arm differs per bucket). Plain
# has a rate everywhere because the policy decodes plainly until it may switch (min_dwell_steps after start).
TRUE_RATES = {
    1: {"8_4_16": 30.0, "6_4_8": 24.0, "4_1_4": 18.0, PLAIN: 10.0},
    4: {"8_4_16": 16.0, "6_4_8": 20.0, "4_1_4": 15.0, PLAIN: 10.0},
    16: {"8_4_16": 6.0, "6_4_8": 7.5, "4_1_4": 8.5, PLAIN: 10.0},
}


def play(
    policy: AdaptivePolicy, batch_size: int, steps: int, rng: random.Random, noise: float = 0.15, rates=None
) -> list[str]:
    chosen = []
    bucket = policy.bucket_of(batch_size)
    rates = rates or TRUE_RATES[bucket]
    for _ in range(steps):
        strategy = policy.select(batch_size)
        name = PLAIN if strategy is None else strategy.name
        rate = rates[name] * (1 + noise * rng.gauss(0, 1))
        seconds = 0.01
        policy.observe(
            strategy, batch_size, committed_tokens=int(rate * seconds * batch_size * 1000), seconds=seconds * 1000
        )
        chosen.append(name)
    return chosen


def config(**overrides) -> SpeculativeConfig:
    base = {"threshold": 32, "buckets": (1, 4, 16), "strategies": STRATEGIES, "plain_arm_min_batch": 16}
    return SpeculativeConfig(**{**base, **overrides})


def test_plain_above_threshold_always():
    policy = AdaptivePolicy(config())
    assert all(policy.select(batch) is None for batch in (33, 64, 256))


@pytest.mark.parametrize("batch_size,best", [(1, "8_4_16"), (2, "8_4_16"), (5, "6_4_8"), (20, PLAIN)])
def test_bandit_converges_to_the_best_arm_of_each_bucket(batch_size, best):
    # Stated bound: after 60 steps the greedy choice is the true best arm, and over steps 60-260 the best arm is
    # played at least (1 - epsilon) - 0.05 of the time.
    policy = AdaptivePolicy(config(epsilon=0.1, min_dwell_steps=0))
    rng = random.Random(1)
    play(policy, batch_size, 60, rng)
    assert policy.best_arm(policy.bucket_of(batch_size)) == best
    later = play(policy, batch_size, 200, rng)
    assert later.count(best) / len(later) >= 0.85


def test_bandit_explores_close_arms_and_samples_a_clearly_slower_one_afresh_when_stale_backing_off():
    # 4_1_4 is within CONTENDER_MARGIN of the best, 8_4_16 at half its rate is not: epsilon keeps trying the close
    # arm, while the slow one sits out STALE_FACTOR x window plays of the bucket, then gets min_samples fresh plays;
    # each fresh sample that finds it still behind doubles its next wait (up to 2**MAX_STALE_DOUBLINGS).
    rates = {"6_4_8": 20.0, "4_1_4": 19.0, "8_4_16": 10.0}
    policy = AdaptivePolicy(config(epsilon=0.2, min_dwell_steps=0, window=4))
    chosen = play(policy, 5, 600, random.Random(0), noise=0.02, rates=rates)
    stale_period, fresh = STALE_FACTOR * 4, policy.config.min_samples
    assert chosen.count("4_1_4") >= 0.2 * 600 / 2 * 0.6  # about half the exploration goes to the close arm
    # After the first forced plays (3 here: the very first step, the catch-up into SD, is not rewarded):
    slow_steps = [i for i, name in enumerate(chosen) if name == "8_4_16" and i >= 3 * fresh + 1]
    bursts = [slow_steps[k : k + fresh] for k in range(0, len(slow_steps), fresh)]
    assert all(burst == list(range(burst[0], burst[0] + fresh)) for burst in bursts)  # min_samples in a row
    gaps = [b[0] - a[-1] for a, b in zip(bursts, bursts[1:], strict=False)]
    waits = [stale_period * 2 ** min(k + 1, MAX_STALE_DOUBLINGS) for k in range(len(gaps))]
    # Only when stale, then promptly: unless another arm's fresh sample came first (one per max(window, 2 x
    # min_samples) plays).
    spacing = max(4, 2 * fresh)
    assert len(gaps) >= 3 and all(wait <= gap <= wait + spacing for gap, wait in zip(gaps, waits, strict=True)), gaps


def test_a_stale_arm_that_is_chosen_on_its_rate_starts_its_wait_over():
    rates = {"6_4_8": 20.0, "4_1_4": 19.0, "8_4_16": 10.0}
    policy = AdaptivePolicy(config(epsilon=0.1, min_dwell_steps=0, window=4))
    rng = random.Random(0)
    play(policy, 5, 300, rng, noise=0.02, rates=rates)  # 8_4_16 sampled afresh and found behind several times
    assert policy.arms[4]["8_4_16"].stale_doublings == MAX_STALE_DOUBLINGS
    play(policy, 5, 300, rng, noise=0.02, rates={**rates, "8_4_16": 30.0})  # the drafter got better at it
    assert policy.arms[4]["8_4_16"].stale_doublings == 0 and policy.best_arm(4) == "8_4_16"
    later = play(policy, 5, 200, rng, noise=0.02, rates=rates)  # and worse again: back to the first wait
    assert policy.best_arm(4) == "6_4_8" and policy.arms[4]["8_4_16"].stale_doublings >= 1
    slow = [i for i, name in enumerate(later) if name == "8_4_16"]
    first_gap = next(j - i for i, j in zip(slow, slow[1:], strict=False) if j - i > 1)
    assert STALE_FACTOR * 4 <= first_gap <= STALE_FACTOR * 4 + 4  # the first wait, not the doubled ones


def test_a_slower_arm_that_improves_is_taken_up_soon_after_its_fresh_samples():
    rates = {"6_4_8": 20.0, "4_1_4": 19.0, "8_4_16": 10.0}
    policy = AdaptivePolicy(config(epsilon=0.1, min_dwell_steps=0))
    rng = random.Random(0)
    play(policy, 5, 300, rng, noise=0.02, rates=rates)
    later = play(policy, 5, 600, rng, noise=0.02, rates={**rates, "8_4_16": 30.0})  # the drafter got better at it
    stale_period = STALE_FACTOR * policy.config.window
    assert later[stale_period + 40 :].count("8_4_16") / len(later[stale_period + 40 :]) >= 0.85


def test_stale_arms_are_sampled_afresh_at_most_once_per_window_so_the_best_keeps_its_share():
    # A one-step window and three clearly slower arms: each would be stale every few steps and the bucket would
    # rotate through all arms; refreshes (min_samples = 2 plays each) come at most every 2 x 2 plays instead.
    rates = {"8_4_16": 5.0, "6_4_8": 5.0, "4_1_4": 20.0, PLAIN: 5.0}
    policy = AdaptivePolicy(config(epsilon=0.0, probe_rate=0.0, min_dwell_steps=0, window=1, plain_arm_min_batch=1))
    chosen = play(policy, 5, 400, random.Random(0), noise=0.02, rates=rates)
    assert chosen[100:].count("4_1_4") / 300 >= 0.45


def test_one_arm_per_bucket_still_works():
    policy = AdaptivePolicy(config(strategies=("4_1_4",), plain_arm_min_batch=64))
    chosen = play(policy, 3, 50, random.Random(0))
    assert set(chosen) == {"4_1_4"}  # from the first step: no dwell before the first mode is chosen


def test_hysteresis_bounds_plain_sd_switching():
    # At the plain/SD border the two arms are nearly equal, so an unprotected bandit would flap constantly.
    policy = AdaptivePolicy(config(epsilon=0.5, min_dwell_steps=4, probe_rate=0.0))
    chosen = play(policy, 20, 400, random.Random(0))
    modes = ["plain" if name == PLAIN else "sd" for name in chosen]
    switches = sum(a != b for a, b in zip(modes, modes[1:], strict=False))
    assert switches <= len(modes) / 4 and policy.num_mode_switches == switches
    runs, current = [], 1
    for a, b in zip(modes, modes[1:], strict=False):
        if a == b:
            current += 1
        else:
            runs.append(current)
            current = 1
    assert min(runs[1:] or [4]) >= 4  # every mode is held for at least min_dwell_steps steps


def mode_runs(chosen: list[str]) -> list[tuple[str, int]]:
    runs: list[tuple[str, int]] = []
    for name in chosen:
        mode = PLAIN if name == PLAIN else "sd"
        if runs and runs[-1][0] == mode:
            runs[-1] = (mode, runs[-1][1] + 1)
        else:
            runs.append((mode, 1))
    return runs


@pytest.mark.parametrize("batch_size,best_mode", [(20, PLAIN), (1, "sd")])
def test_the_other_mode_is_probed_rarely_and_briefly(batch_size, best_mode):
    # Crossing modes costs a drafter catch-up, so after the forced samples the losing mode is only probed: one
    # plain step, or two SD steps (the first is the catch-up), about probe_rate of the steps, without dwelling.
    policy = AdaptivePolicy(config(epsilon=0.1, min_dwell_steps=4, probe_rate=0.05, plain_arm_min_batch=1))
    rng = random.Random(0)
    play(policy, batch_size, 60, rng)
    probes_before = policy.num_probes
    runs = mode_runs(play(policy, batch_size, 1000, rng))
    other = [length for mode, length in runs if mode != best_mode]
    assert other and max(other) == (2 if best_mode == PLAIN else 1)
    probes = policy.num_probes - probes_before  # a few probes land right after a probe and add no run of their own
    assert 0.02 * 1000 <= len(other) <= probes <= 0.08 * 1000


def test_a_catch_up_step_is_not_rewarded():
    policy = AdaptivePolicy(config(strategies=("4_1_4",), min_dwell_steps=0, min_samples=1, epsilon=0.0))
    first = policy.select(3)  # forced sampling: 4_1_4 first, entering SD from plain
    assert first is not None and first.name == "4_1_4"
    policy.observe(first, 3, committed_tokens=3, seconds=1.0)  # the catch-up step: not recorded
    assert policy.arms[1]["4_1_4"].plays == 0
    second = policy.select(3)
    policy.observe(second, 3, committed_tokens=30, seconds=1.0)
    assert policy.arms[1]["4_1_4"].plays == 1 and policy.arms[1]["4_1_4"].rate() == 10.0


def test_a_speculative_step_after_admissions_is_not_rewarded():
    # New requests joined while speculating: the step's time includes the drafter reading their prompts.
    policy = AdaptivePolicy(config(strategies=("4_1_4",), min_dwell_steps=0, min_samples=1, epsilon=0.0))
    for _ in range(3):  # enter SD (the catch-up, not rewarded), then two rewarded steps
        policy.observe(policy.select(2), 2, committed_tokens=8, seconds=1.0)
    assert policy.arms[1]["4_1_4"].plays == 2
    grown = policy.select(3)
    policy.observe(grown, 3, committed_tokens=3, seconds=9.0)
    assert grown is not None and policy.arms[1]["4_1_4"].plays == 2  # not recorded
    policy.observe(policy.select(3), 3, committed_tokens=12, seconds=1.0)
    assert policy.arms[1]["4_1_4"].plays == 3


def feed(policy: AdaptivePolicy, bucket: int, name: str, steps) -> None:
    """Record (committed tokens, seconds, batch size) steps for one arm directly."""
    arm = policy.arms[bucket][name]
    for step in steps:
        policy.bucket_plays[bucket] += 1
        arm.record(*step, bucket_plays=policy.bucket_plays[bucket])


def test_arms_are_ranked_by_throughput_not_by_the_typical_step():
    """An SD step commits 1..depth+1 tokens per row: skewed counts whose median is not the throughput."""
    policy = AdaptivePolicy(config(strategies=("4_1_4", "2_1_2"), plain_arm_min_batch=64))
    feed(policy, 1, "4_1_4", [(5, 1.0, 1)] * 6 + [(1, 1.0, 1)] * 4)  # median 5 tokens/step, mean 3.4
    feed(policy, 1, "2_1_2", [(4, 1.0, 1)] * 10)  # always 4
    assert policy.arms[1]["4_1_4"].rate() == pytest.approx(3.4, abs=0.5)
    assert policy.best_arm(1) == "2_1_2"


def test_rate_is_per_request_second_and_ignores_a_stalled_step():
    policy = AdaptivePolicy(config())
    feed(policy, 4, "6_4_8", [(8, 1.0, 4), (12, 1.0, 6)])  # 2 tokens per request-second at batch 4 and 6 alike
    assert policy.arms[4]["6_4_8"].rate() == pytest.approx(2.0)
    feed(policy, 4, "4_1_4", [(8, 1.0, 4)] * 9 + [(8, 20.0, 4)])  # one step stalled 20x (the slowest tenth)
    assert policy.arms[4]["4_1_4"].rate() == pytest.approx(2.0)


def test_same_seed_same_decisions_and_state_is_inspectable():
    first, second = AdaptivePolicy(config(seed=3)), AdaptivePolicy(config(seed=3))
    assert play(first, 5, 100, random.Random(2)) == play(second, 5, 100, random.Random(2))
    state = first.state()
    assert set(state["buckets"]) == {1, 4, 16} and state["best"][4] in STRATEGIES
    assert state["buckets"][4]["6_4_8"]["plays"] > 0
    assert state["bucket_plays"][4] == sum(arm["plays"] for arm in state["buckets"][4].values())
    assert max(arm["last_play"] for arm in state["buckets"][4].values()) == state["bucket_plays"][4]


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"threshold": 0}, "threshold"),
        ({"buckets": (2, 4)}, "ascend strictly from 1"),
        ({"buckets": (1, 64)}, "stay <= tlt.speculative.threshold"),
        ({"strategies": ()}, "non-empty"),
        ({"strategies": ("4-1-4",)}, "depth_topk_treetokens"),
        ({"epsilon": 1.5}, "epsilon"),
        ({"probe_rate": -0.1}, "probe_rate"),
        ({"window": 0}, "window"),
    ],
)
def test_bad_config_fails_clearly(overrides, match):
    with pytest.raises(ValueError, match=match):
        config(**overrides)


def test_the_default_buckets_follow_a_lower_threshold_but_explicit_ones_do_not():
    assert SpeculativeConfig(threshold=8).buckets == (1, 2, 3, 4, 6, 8)
    assert SpeculativeConfig(threshold=16, buckets=(1, 4, 16)).buckets == (1, 4, 16)
    with pytest.raises(ValueError, match="stay <= tlt.speculative.threshold=8"):
        SpeculativeConfig(threshold=8, buckets=(1, 4, 16))


def test_strategy_strings_that_parse_but_cannot_exist_fail_when_the_policy_is_built():
    with pytest.raises(ValueError, match="tree_tokens"):
        AdaptivePolicy(config(strategies=("2_2_7",)))  # a depth-2, top-2 tree has only 6 nodes


def test_first_plays_skip_arms_the_ranked_buckets_find_clearly_behind_until_they_are_stale():
    # Bucket 4 has ranked 8_4_16 at half the best rate; bucket 1 then skips its first plays of it (a few slow steps
    # saved in a bucket the tail rarely visits) but still tries the close arms. Here 8_4_16 is in fact best at batch
    # 1: the skipped arm is sampled once it has sat out STALE_FACTOR x window plays of bucket 1, and taken up.
    policy = AdaptivePolicy(config(epsilon=0.1, min_dwell_steps=0, window=8))
    rng = random.Random(0)
    play(policy, 5, 40, rng, noise=0.02, rates={"8_4_16": 10.0, "6_4_8": 20.0, "4_1_4": 18.0})
    assert policy.arms[4]["8_4_16"].rate() < 0.8 * policy.arms[4]["6_4_8"].rate()
    chosen = play(policy, 1, 200, rng, noise=0.02, rates={"8_4_16": 30.0, "6_4_8": 20.0, "4_1_4": 17.0})
    stale_period = STALE_FACTOR * 8
    first = chosen.index("8_4_16")
    assert {"6_4_8", "4_1_4"} <= set(chosen[:first]) and stale_period <= first <= stale_period + 8
    assert chosen[first + 20 :].count("8_4_16") / len(chosen[first + 20 :]) >= 0.85


def test_a_bucket_that_has_not_tried_its_arms_yet_is_no_neighbour_to_skip_by():
    # Bucket 4 has played two of its three arms (8_4_16 far behind 6_4_8) and not yet 4_1_4: bucket 1 must not skip
    # arms on such partial evidence.
    policy = AdaptivePolicy(config(epsilon=0.0, min_dwell_steps=0))
    rng = random.Random(0)
    play(policy, 5, 5, rng, noise=0.0, rates={"8_4_16": 5.0, "6_4_8": 20.0, "4_1_4": 20.0})
    arms = policy.arms[4]
    assert arms["8_4_16"].plays == arms["6_4_8"].plays == policy.config.min_samples and arms["4_1_4"].plays == 0
    chosen = play(policy, 1, 3 * policy.config.min_samples, rng, noise=0.0, rates=TRUE_RATES[1])
    assert sorted(set(chosen)) == sorted(STRATEGIES)


def test_an_arm_is_skipped_only_if_every_ranked_bucket_finds_it_clearly_behind():
    # Bucket 16 finds 8_4_16 far behind, bucket 4 finds it close to the best: bucket 1 still gives it its first plays.
    policy = AdaptivePolicy(config(epsilon=0.1, min_dwell_steps=0, window=8))
    rng = random.Random(0)
    play(policy, 20, 40, rng, noise=0.02, rates={"8_4_16": 5.0, "6_4_8": 20.0, "4_1_4": 18.0, PLAIN: 4.0})
    play(policy, 5, 40, rng, noise=0.02, rates={"8_4_16": 19.0, "6_4_8": 20.0, "4_1_4": 18.0})
    assert policy.arms[16]["8_4_16"].rate() < 0.5 * policy.arms[16]["6_4_8"].rate()
    chosen = play(policy, 1, 10, rng, noise=0.02, rates=TRUE_RATES[1])
    assert "8_4_16" in chosen[:8]


# Group drafts: where siblings answer alike (low temperature, a converged policy) suffix drafts are long and cost no
# drafter compute; where they differ they are short and the drafter wins. The policy must learn which, per bucket.
GROUP_RATES = {
    "siblings agree": {"4_1_4": 14.0, "suffix:8_1_8": 30.0, "mixed:4_1_4": 18.0, PLAIN: 10.0},
    "siblings differ": {"4_1_4": 14.0, "suffix:8_1_8": 9.0, "mixed:4_1_4": 12.5, PLAIN: 10.0},
}


@pytest.mark.parametrize(("world", "best"), [("siblings agree", "suffix:8_1_8"), ("siblings differ", "4_1_4")])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_the_policy_learns_which_draft_source_pays(world, best, batch_size):
    group_config = config(
        strategies=("4_1_4",), group_drafts=True, group_strategies=("suffix:8_1_8", "mixed:4_1_4"), min_dwell_steps=0
    )
    policy = AdaptivePolicy(group_config)
    assert set(policy.strategies) == {"4_1_4", "suffix:8_1_8", "mixed:4_1_4"}
    rng = random.Random(2)
    play(policy, batch_size, 60, rng, rates=GROUP_RATES[world])
    assert policy.best_arm(policy.bucket_of(batch_size)) == best
    later = play(policy, batch_size, 200, rng, rates=GROUP_RATES[world])
    assert later.count(best) / len(later) >= 0.85


def test_group_strategies_are_arms_only_with_group_drafts_on():
    assert "suffix:8_1_8" not in AdaptivePolicy(config()).strategies
    assert "suffix:8_1_8" in AdaptivePolicy(config(group_drafts=True)).strategies
