"""When to speculate and how: a batch-size threshold plus a bucketed epsilon-greedy bandit (TLT's BEG-MAB).

Speculative decoding pays off only while the running batch is small. `AdaptivePolicy.select(batch_size)` returns
None (plain decoding) above `threshold`; at or below it, the batch size picks a bucket and that bucket's bandit
picks an arm: an SD strategy, or plain decoding where plain is an arm (buckets starting at `plain_arm_min_batch`
or above; by default every bucket), so the policy can learn where SD does not pay. After the step the engine
reports what happened with `observe`; the reward is committed tokens per second per running request, which stays
comparable across the batch sizes that share a bucket. Each arm keeps a window of its latest rewards and is
judged by their median, so a few noisy steps cannot capture the policy.

Exploration: every arm is tried `min_samples` times first (in a fixed order), then with probability `epsilon` a
random arm is played, otherwise the best median. Unlike the reference implementation, whose buckets held one
strategy each and so never explored, every bucket here has several arms.

Hysteresis: switching between plain and SD (either way) is allowed only after `min_dwell_steps` steps in the
current mode; SD strategies may change every step (the torch engine switches them for free). Deterministic under
`seed`; `state()` shows everything the policy believes.
"""

from __future__ import annotations

import random
import statistics
from collections import deque
from dataclasses import dataclass, field

from verl_tlt.config import SpeculativeConfig
from verl_tlt.spec.strategy import SpecStrategy

PLAIN = "plain"


# The knobs are the `tlt.speculative` block itself: one dataclass, one set of defaults, validated at construction.
AdaptiveConfig = SpeculativeConfig


@dataclass
class _Arm:
    rewards: deque = field(default_factory=deque)
    plays: int = 0

    def median(self) -> float:
        return statistics.median(self.rewards) if self.rewards else float("-inf")


class AdaptivePolicy:
    def __init__(self, config: AdaptiveConfig | None = None):
        self.config = config or AdaptiveConfig()
        self.strategies = {name: SpecStrategy.parse(name) for name in self.config.strategies}
        self.arms: dict[int, dict[str, _Arm]] = {}
        for lower in self.config.buckets:
            names = list(self.config.strategies)
            if lower >= self.config.plain_arm_min_batch:
                names.append(PLAIN)
            self.arms[lower] = {name: _Arm(deque(maxlen=self.config.window)) for name in names}
        self.rng = random.Random(self.config.seed)
        self.mode = PLAIN  # PLAIN or "sd": what the last step did
        self.steps_in_mode = 0
        self.num_mode_switches = 0
        self.last_choice: tuple[int | None, str] = (None, PLAIN)

    # ----- decisions -----------------------------------------------------------------------------------------

    def bucket_of(self, batch_size: int) -> int | None:
        """Lower bound of the bucket for batch_size, or None above the threshold."""
        if batch_size > self.config.threshold or batch_size < 1:
            return None
        return max(lower for lower in self.config.buckets if lower <= batch_size)

    def select(self, batch_size: int) -> SpecStrategy | None:
        """The strategy for the next decode step of `batch_size` requests (None = plain decoding)."""
        bucket = self.bucket_of(batch_size)
        choice = PLAIN if bucket is None else self._bandit_choice(bucket)
        choice = self._apply_hysteresis(bucket, choice)
        self._enter_mode(PLAIN if choice == PLAIN else "sd")
        self.last_choice = (bucket, choice)
        return None if choice == PLAIN else self.strategies[choice]

    def observe(self, strategy: SpecStrategy | None, batch_size: int, committed_tokens: int, seconds: float) -> None:
        """Record a finished decode step (strategy None = plain)."""
        bucket = self.bucket_of(batch_size)
        if bucket is None or seconds <= 0 or batch_size < 1:
            return
        name = PLAIN if strategy is None else strategy.name
        arm = self.arms[bucket].get(name)
        if arm is None:  # a strategy the caller forced, not one of ours: nothing to learn for the bandit
            return
        arm.rewards.append(committed_tokens / seconds / batch_size)
        arm.plays += 1

    # ----- inspection ----------------------------------------------------------------------------------------

    def best_arm(self, bucket: int) -> str:
        arms = self.arms[bucket]
        return max(arms, key=lambda name: (arms[name].median(), -list(arms).index(name)))

    def state(self) -> dict:
        return {
            "mode": self.mode,
            "num_mode_switches": self.num_mode_switches,
            "buckets": {
                lower: {
                    name: {"plays": arm.plays, "median_reward": arm.median() if arm.rewards else None}
                    for name, arm in arms.items()
                }
                for lower, arms in self.arms.items()
            },
            "best": {lower: self.best_arm(lower) for lower in self.arms},
        }

    # ----- internals -----------------------------------------------------------------------------------------

    def _bandit_choice(self, bucket: int) -> str:
        arms = self.arms[bucket]
        for name, arm in arms.items():
            if arm.plays < self.config.min_samples:
                return name
        if self.rng.random() < self.config.epsilon:
            return self.rng.choice(list(arms))
        return self.best_arm(bucket)

    def _apply_hysteresis(self, bucket: int | None, choice: str) -> str:
        wants = PLAIN if choice == PLAIN else "sd"
        if wants == self.mode or self.steps_in_mode >= self.config.min_dwell_steps:
            return choice
        if self.mode == PLAIN or bucket is None:
            return PLAIN
        # Stay speculative: the best SD arm of this bucket.
        sd_arms = {n: a for n, a in self.arms[bucket].items() if n != PLAIN}
        return max(sd_arms, key=lambda n: (sd_arms[n].median(), -list(sd_arms).index(n)))

    def _enter_mode(self, mode: str) -> None:
        if mode == self.mode:
            self.steps_in_mode += 1
            return
        self.mode, self.steps_in_mode = mode, 1
        self.num_mode_switches += 1
