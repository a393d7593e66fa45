"""When to speculate and how: a batch-size threshold plus a bucketed epsilon-greedy bandit (TLT's BEG-MAB).

Speculative decoding pays off only while the running batch is small. `AdaptivePolicy.select(batch_size)` returns
None (plain decoding) above `threshold`; at or below it, the batch size picks a bucket and that bucket's bandit
picks an arm: an SD strategy, or plain decoding where plain is an arm (buckets starting at `plain_arm_min_batch`
or above; by default every bucket), so the policy can learn where SD does not pay. After the step the engine
reports what happened with `observe`. Each arm keeps its latest steps (committed tokens, seconds, batch size) and is
judged by its rate over them: committed tokens per request-second (seconds x running requests, which keeps batch
sizes that share a bucket comparable), with the slowest tenth of the steps left out, so a stalled step (garbage
collection, another process) cannot capture the policy. A ratio of sums, not the median of per-step rates: a
speculative step commits anything from 1 to depth + 1 tokens per row, and for such skewed counts the median of
per-step rates is not the throughput the arm delivers.

Exploration: every arm is tried `min_samples` times first (in a fixed order), then with probability `epsilon` a
random contender of the current mode is played (another SD strategy while speculating), otherwise the best rate.
Contenders are the arms within CONTENDER_MARGIN of the best rate: exploring an arm that is clearly slower (a tree
strategy where verifying is expensive) costs a slow step and teaches little. Such an arm is not written off: once
it has sat out STALE_FACTOR x `window` plays of its bucket, its old steps are dropped and it is sampled afresh
(`min_samples` plays; at most one such arm per `window` plays of the bucket, and never more than half of them),
so that a drafter or target that changes (as in RL) can bring it back. Each fresh sample that finds it still
behind doubles its next wait (up to 2**MAX_STALE_DOUBLINGS times), and the wait starts over once the bandit picks
it on its rate again: over a long RL run an arm that never pays stops costing slow steps every few windows.
The first plays can be skipped too: most buckets see few steps per rollout (the batch passes through the sizes
between the threshold and the tail quickly), and playing every arm there twice would take rollouts of slow steps.
So an arm that every other bucket which has ranked it (past its own first plays) finds more than NEIGHBOUR_MARGIN
behind its best is not played first in a new bucket; it waits to be stale like any clearly slower arm.
Crossing between plain and SD is not free: the first speculative step after plain ones must catch the drafter up
on every token decoded plainly, and with a drafter that does not pay, each SD step costs several plain ones. So the
other mode is explored only by rare probes (`probe_rate` per step): one plain step, or PROBE_SD_STEPS speculative
steps with a random strategy. Unlike the reference implementation, whose buckets held one strategy each and so
never explored, every bucket here has several arms.

The first speculative step after plain decoding is not rewarded: its time is mostly that catch-up, a cost of
switching rather than of the strategy (the hysteresis below accounts for switching). Nor is a speculative step
right after the batch grew: the drafter first reads the new requests' prompts.

Hysteresis: switching between plain and SD (either way) by the greedy choice is allowed only after
`min_dwell_steps` steps in the current mode (none at the start: there is nothing to flap from); probes, and the
return from a probe, do not wait. SD strategies may change every step (the torch engine switches them for free).

Costs known before the first play: with a `CostModel` (policy.cost_model: the replica's timed step costs and its
drafter's probed acceptance), the first plays go in the order of the arms' predicted rates, and a drafter arm
predicted more than PREDICTED_MARGIN behind plain is not played first (it waits for a probe, or to be stale, like an
arm found clearly slower). Where no drafter arm is predicted within that margin of plain, the bucket decodes plainly
from its first step and only probes speculate (probes refine the acceptance, so a drafter the probe underrated is
picked up); those plain steps are counted (`unpaid_plain_steps`) and `cannot_pay()` says why. Each probe taken
there halves the next one's chance (down to 2**-MAX_UNPAID_PROBE_HALVINGS x `probe_rate`) until a drafter is
predicted to pay again: on SmolLM2 and 2 CPU cores a drafter with acceptance near 0 spent 1.2-1.8 s of a 17 s
rollout in probes at the full rate. Deterministic under
`seed`; `state()` shows everything the policy believes.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from verl_tlt.policy.cost_model import CostModel
from verl_tlt.policy.gate import PLAIN, SpeculationGate
from verl_tlt.policy.protocol import PolicySettings
from verl_tlt.spec.strategy import SpecStrategy

__all__ = ["PLAIN", "AdaptivePolicy"]  # PLAIN re-exported: the arm name callers compare choices with
# Share of an arm's window (its slowest steps per row) left out of its rate.
TRIM_SHARE = 0.1
# Epsilon explores the arms whose rate is at least (1 - CONTENDER_MARGIN) x the best of their mode; an arm further
# behind is replayed only once it has sat out STALE_FACTOR x window plays of its bucket. Chosen on an offline replay
# of step costs recorded from `bench adaptive`'s rollout, where exploring every arm wasted a few percent on the trees;
# margins of 0.1-0.25 and factors of 4-8 did about equally well, and a factor of 1 lost what the margin won.
CONTENDER_MARGIN = 0.1
STALE_FACTOR = 4
# An arm's first plays in a bucket are skipped when every bucket that ranked it puts it more than this far behind its
# best there (wider than CONTENDER_MARGIN: other batch sizes rank close arms differently).
NEIGHBOUR_MARGIN = 0.2
# Each fresh sample that finds a stale arm still behind doubles its next wait, up to 2**MAX_STALE_DOUBLINGS x
# STALE_FACTOR x window plays: in a long RL run an arm that never pays (a tree on a CPU) stops costing a few slow
# steps every few windows, while one that catches up is taken again and its wait starts over.
MAX_STALE_DOUBLINGS = 2
# Speculative steps of a probe from plain mode: the first pays the drafter catch-up (not rewarded), the second is
# measured.
PROBE_SD_STEPS = 2
# A drafter arm predicted (cost model) to deliver less than (1 - PREDICTED_MARGIN) x plain's rate is not played first;
# where every drafter arm of a bucket is, the bucket decodes plainly. Wide enough for the model's error on arms close
# to plain (measured: a drafter accepting 1.4-1.5 tokens predicted at about half of plain on SmolLM2 and CPU).
PREDICTED_MARGIN = 0.1
# Probes from plain where nothing is predicted to pay: each one halves the next one's chance, at most this many times
# (1/16 of `probe_rate`), so a drafter that keeps not paying is still probed now and then, at a sixteenth of the cost.
MAX_UNPAID_PROBE_HALVINGS = 4


@dataclass
class _Arm:
    steps: deque = field(default_factory=deque)  # (committed tokens, seconds, batch size) of the latest steps
    plays: int = 0  # rewarded steps since the arm's steps were last dropped (`forget`)
    last_play: int = 0  # the bucket's play count when this arm was last played
    stale_doublings: int = 0  # fresh samples since the bandit last chose this arm on its rate: its wait doubles each
    _rate: float | None = None  # cached rate(), dropped by record()

    def record(self, committed_tokens: int, seconds: float, batch_size: int, bucket_plays: int) -> None:
        self.steps.append((committed_tokens, seconds, batch_size))
        self.plays += 1
        self.last_play = bucket_plays
        self._rate = None

    def stale_wait(self, window: int) -> int:
        """Plays of its bucket this arm sits out before it is sampled afresh: STALE_FACTOR windows, doubled for each
        fresh sample since the bandit last chose it on its rate."""
        return STALE_FACTOR * window * 2**self.stale_doublings

    def forget(self) -> None:
        """Drop the arm's steps: it is sampled afresh (its rate is -inf until its next step)."""
        self.steps.clear()
        self.plays = 0
        self._rate = None

    def rate(self) -> float:
        """Committed tokens per request-second over the window, its slowest TRIM_SHARE of steps (per row) left out;
        -inf before the first step."""
        if self._rate is None:
            self._rate = self._windowed_rate()
        return self._rate

    def _windowed_rate(self) -> float:
        if not self.steps:
            return float("-inf")
        by_speed = sorted(self.steps, key=lambda step: step[1] / step[2])  # seconds per row, fastest first
        kept = by_speed[: len(by_speed) - int(TRIM_SHARE * len(by_speed))]
        return sum(tokens for tokens, _, _ in kept) / sum(seconds * batch for _, seconds, batch in kept)


class AdaptivePolicy:
    def __init__(self, config: PolicySettings, costs: CostModel | None = None):
        """config: the `tlt.speculative` block itself (`config.SpeculativeConfig`: one dataclass, one set of
        defaults, checked when built). costs: the replica's predictions (None: play every arm first, as before any
        costs are measured; `attach_costs` adds them later)."""
        self.config = config
        self.costs = costs
        self.unpaid_plain_steps = 0  # steps decoded plainly in a bucket where no drafter arm was predicted to pay
        self.unpaid_probes = 0  # SD probes where nothing was predicted to pay, since a drafter last was: they back off
        self.gate = SpeculationGate(config.threshold, tuple(config.buckets))
        self.strategies = {name: SpecStrategy.parse(name) for name in config.arm_strategies}
        self.arms: dict[int, dict[str, _Arm]] = {
            lower: {
                name: _Arm(deque(maxlen=config.window))
                for name in self.gate.arm_names(lower, config.arm_strategies, config.plain_arm_min_batch)
            }
            for lower in self.gate.buckets
        }
        self.bucket_plays = dict.fromkeys(self.arms, 0)  # rewarded steps per bucket
        self.last_refresh = dict.fromkeys(self.arms, 0)  # bucket_plays when a stale arm was last sampled afresh
        self._last_batch_size = 0
        self._batch_grew = False  # the batch of the current step is larger than the previous step's (admissions)
        self.rng = random.Random(self.config.seed)
        self.mode = PLAIN  # PLAIN or "sd": what the last step did
        self.steps_in_mode = config.min_dwell_steps  # no dwell before the first switch: nothing to flap from
        self._stepped = False  # no step chosen yet
        self.num_mode_switches = 0
        self.num_probes = 0
        self.last_choice: tuple[int | None, str] = (None, PLAIN)
        self._probe: tuple[str, int] | None = None  # (arm, steps left) of a running probe
        self._in_probe_mode = False  # the current mode was entered by a probe: leaving it needs no dwell

    # ----- decisions -----------------------------------------------------------------------------------------

    @property
    def threshold(self) -> int:
        return self.gate.threshold

    def bucket_of(self, batch_size: int) -> int | None:
        """Lower bound of the bucket for batch_size, or None above the threshold."""
        return self.gate.bucket_of(batch_size)

    def attach_costs(self, costs: CostModel | None) -> None:
        """Predict arms from now on (or, with None, stop): `costs` as measured by the replica."""
        self.costs = costs

    def new_drafter(self, probe_alpha: float | None) -> None:
        """A new drafter is in use: its acceptance starts from its self-test probe's score (None: not probed)."""
        if self.costs is not None:
            self.costs.new_drafter(probe_alpha)
        if self.cannot_pay() is None:  # this one may pay: probe it at the full rate (a new one that cannot keeps on)
            self.unpaid_probes = 0

    def predicted_rate(self, name: str, batch_size: int) -> float | None:
        """The cost model's committed tokens per request-second for arm `name` at `batch_size` (None: no model, or it
        cannot predict that arm yet)."""
        return None if self.costs is None else self.costs.predicted_rate(name, batch_size)

    def cannot_pay(self) -> str | None:
        """Why no drafter arm is predicted to pay at any bucket (the numbers), or None when one is, or nothing can be
        predicted yet."""
        if self.costs is None or self.costs.alpha is None:
            return None
        best = self.costs.best_gain(list(self.gate.buckets))
        if best is None or best[0] >= 1.0 - PREDICTED_MARGIN:
            return None
        gain, arm, batch_size = best
        return (
            f"with acceptance alpha={self.costs.alpha:.2f} the best drafter arm, {arm} at batch {batch_size}, is "
            f"predicted at {gain:.2f}x plain's rate (below {1 - PREDICTED_MARGIN:.2f}x)"
        )

    def select(self, batch_size: int) -> SpecStrategy | None:
        """The strategy for the next decode step of `batch_size` requests (None = plain decoding)."""
        self._batch_grew, self._last_batch_size = batch_size > self._last_batch_size, batch_size
        bucket = self.bucket_of(batch_size)
        # Once per step: the probes' back-off and the unpaid-step count both ask it.
        unpaid_bucket = bucket is not None and self._nothing_predicted_to_pay(bucket)
        if bucket is None:
            self._probe = None
            choice, probing = PLAIN, False
        else:
            choice, probing = self._bandit_choice(bucket, unpaid_bucket)
        if not probing:
            choice = self._apply_hysteresis(bucket, choice)
        mode = PLAIN if choice == PLAIN else "sd"
        if mode != self.mode:
            self._in_probe_mode = probing  # a probe opened this mode: leaving it needs no dwell
        elif not probing:
            self._in_probe_mode = False  # the greedy choice holds this mode now
        self._enter_mode(mode)
        self.last_choice = (bucket, choice)
        if choice == PLAIN and unpaid_bucket:
            self.unpaid_plain_steps += 1
        return None if choice == PLAIN else self.strategies[choice]

    def observe(self, strategy: SpecStrategy | None, batch_size: int, committed_tokens: int, seconds: float) -> None:
        """Record a finished decode step (strategy None = plain)."""
        # The first SD step after plain ones (select just entered SD mode) is the catch-up: not rewarded; nor is an SD
        # step right after admissions (the drafter reads the new prompts).
        catch_up = strategy is not None and ((self.mode == "sd" and self.steps_in_mode == 1) or self._batch_grew)
        bucket = self.bucket_of(batch_size)
        if bucket is None or seconds <= 0 or catch_up:
            return
        name = PLAIN if strategy is None else strategy.name
        arm = self.arms[bucket].get(name)
        if arm is None:  # a strategy the caller forced, not one of ours: nothing to learn for the bandit
            return
        self.bucket_plays[bucket] += 1
        arm.record(committed_tokens, seconds, batch_size, self.bucket_plays[bucket])
        if self.costs is not None:
            self.costs.observe(name, batch_size, committed_tokens, seconds)

    # ----- inspection ----------------------------------------------------------------------------------------

    def best_arm(self, bucket: int) -> str:
        arms = self.arms[bucket]
        return max(arms, key=lambda name: (arms[name].rate(), -list(arms).index(name)))

    def state(self) -> dict:
        return {
            "mode": self.mode,
            "num_mode_switches": self.num_mode_switches,
            "num_probes": self.num_probes,
            "unpaid_probes": self.unpaid_probes,
            "bucket_plays": dict(self.bucket_plays),
            "last_refresh": dict(self.last_refresh),
            "buckets": {
                lower: {
                    name: {
                        "plays": arm.plays,
                        "last_play": arm.last_play,
                        "stale_doublings": arm.stale_doublings,
                        "rate": arm.rate() if arm.steps else None,
                        "predicted_rate": self.predicted_rate(name, lower),
                    }
                    for name, arm in arms.items()
                }
                for lower, arms in self.arms.items()
            },
            "best": {lower: self.best_arm(lower) for lower in self.arms},
            "unpaid_plain_steps": self.unpaid_plain_steps,
            "costs": None if self.costs is None else self.costs.state(),
        }

    def take_report(self) -> dict:
        """What the rollout's metrics show of the policy since the last take: steps decoded plainly because no
        drafter arm was predicted to pay (`unpaid_plain_steps`), why nothing pays (`cannot_pay`, None when
        something does), and per arm its predicted and observed rate (committed tokens per request-second), each
        the plays-weighted mean over the buckets where the arm has both."""
        rates: dict[str, dict[str, float]] = {}
        for lower, arms in self.arms.items():
            for name, arm in arms.items():
                predicted = self.predicted_rate(name, lower)
                if predicted is None or not arm.steps:
                    continue
                entry = rates.setdefault(name, {"plays": 0.0, "predicted": 0.0, "observed": 0.0})
                entry["plays"] += arm.plays
                entry["predicted"] += arm.plays * predicted
                entry["observed"] += arm.plays * arm.rate()
        arms_report = {
            name: {"predicted": e["predicted"] / e["plays"], "observed": e["observed"] / e["plays"]}
            for name, e in rates.items()
            if e["plays"]
        }
        report = {"unpaid_plain_steps": self.unpaid_plain_steps, "cannot_pay": self.cannot_pay(), "arms": arms_report}
        self.unpaid_plain_steps = 0
        return report

    # ----- internals -----------------------------------------------------------------------------------------

    def _bandit_choice(self, bucket: int, unpaid_bucket: bool) -> tuple[str, bool]:
        """(arm, whether it is a probe of the other mode). unpaid_bucket: no drafter arm of `bucket` is predicted to
        pay (`_nothing_predicted_to_pay`)."""
        arms = self.arms[bucket]
        if self._probe is not None:  # a running probe continues while its arm exists in this bucket
            name, left = self._probe
            self._probe = (name, left - 1) if left > 1 else None
            if name in arms:
                return name, True
        for name in self._first_play_order(bucket):
            if (
                arms[name].plays < self.config.min_samples
                and not self._clearly_behind_elsewhere(bucket, name)
                and not self._predicted_behind(bucket, name)
            ):
                return name, False
        draw = self.rng.random()
        other = [name for name in arms if (name == PLAIN) != (self.mode == PLAIN)]
        unpaid = self.mode == PLAIN and unpaid_bucket
        # Backed off only while nothing pays here: once probes show a drafter arm that pays, the full rate again.
        halvings = min(self.unpaid_probes, MAX_UNPAID_PROBE_HALVINGS) if unpaid else 0
        if draw < self.config.probe_rate / 2**halvings and other:
            name = self.rng.choice(other)
            if name != PLAIN and PROBE_SD_STEPS > 1:
                self._probe = (name, PROBE_SD_STEPS - 1)
            self.num_probes += 1
            self.unpaid_probes += unpaid
            return name, True
        same = [name for name in arms if (name == PLAIN) == (self.mode == PLAIN)]
        # Right after a probe the greedy choice decides whether to stay, so probes stay short.
        if same and not self._in_probe_mode:
            stale = self._stale_arm(bucket, same)
            if stale is not None:  # sampled afresh: its old steps go, and it gets min_samples plays from now
                arms[stale].forget()
                arms[stale].stale_doublings = min(arms[stale].stale_doublings + 1, MAX_STALE_DOUBLINGS)
                self.last_refresh[bucket] = self.bucket_plays[bucket]
                return stale, False
            if draw < self.config.probe_rate + self.config.epsilon:
                best_rate = max(arms[name].rate() for name in same)
                contenders = [name for name in same if arms[name].rate() >= (1 - CONTENDER_MARGIN) * best_rate]
                return self._on_merit(arms, self.rng.choice(contenders)), False
        return self._on_merit(arms, self.best_arm(bucket)), False

    def _first_play_order(self, bucket: int) -> list[str]:
        """The bucket's arms in the order of their first plays: by predicted rate (best first), then the arms the
        cost model cannot predict, in their configured order."""
        names = list(self.arms[bucket])
        if self.costs is None:
            return names
        rates = {name: self.costs.predicted_rate(name, bucket) for name in names}
        predicted = sorted((n for n in names if rates[n] is not None), key=lambda n: -rates[n])
        return predicted + [n for n in names if rates[n] is None]

    def _predicted_behind(self, bucket: int, name: str) -> bool:
        """Whether the cost model puts drafter arm `name` more than PREDICTED_MARGIN behind plain at the bucket's
        lower bound (an arm sampled afresh because it was stale is not skipped: that is its probe)."""
        if self.costs is None or name == PLAIN or self.arms[bucket][name].stale_doublings:
            return False
        return self.costs.behind_plain(name, bucket, PREDICTED_MARGIN)

    def _nothing_predicted_to_pay(self, bucket: int) -> bool:
        """Whether the cost model can predict the bucket's drafter arms and puts every one behind plain by the
        margin."""
        if self.costs is None:
            return False
        names = [name for name in self.arms[bucket] if name != PLAIN and self.costs.predicts(name)]
        return bool(names) and all(self.costs.behind_plain(name, bucket, PREDICTED_MARGIN) for name in names)

    @staticmethod
    def _on_merit(arms: dict[str, _Arm], name: str) -> str:
        """An arm chosen for its rate (best, or an epsilon contender): if it was being sampled afresh it has caught
        up, so its next stale wait starts over."""
        arms[name].stale_doublings = 0
        return name

    def _clearly_behind_elsewhere(self, bucket: int, name: str) -> bool:
        """Whether every other bucket that has ranked `name` (min_samples plays of it, and as many steps as the
        first plays of all its arms, so it has seen more than one or two of them) puts it more than
        NEIGHBOUR_MARGIN behind its best ranked arm there; False when none has. Buckets the rollout rarely visits
        (the few steps between the threshold and the tail, the last requests) would otherwise spend their few steps
        for rollouts on clearly slower arms. Every ranking bucket must agree, not just the nearest: a ranking rests
        on a few noisy steps per arm, and skipping an arm that is in fact best costs a bucket the wait until it is
        stale, while a close arm (a chain beside another chain) does not fall behind everywhere by chance. An arm
        being sampled afresh (stale) is not skipped: that check is of its own bucket."""
        if self.arms[bucket][name].stale_doublings:
            return False
        min_samples, verdicts = self.config.min_samples, []
        for lower, arms in self.arms.items():
            if lower == bucket or name not in arms or arms[name].plays < min_samples:
                continue
            if self.bucket_plays[lower] < min_samples * len(arms):  # still in its own first plays
                continue
            best = max(arm.rate() for arm in arms.values() if arm.plays >= min_samples)
            verdicts.append(arms[name].rate() < (1 - NEIGHBOUR_MARGIN) * best)
        return bool(verdicts) and all(verdicts)

    def _stale_arm(self, bucket: int, names: list[str]) -> str | None:
        """An arm of `names` that has sat out its wait (`_Arm.stale_wait`), if one is due: at most one per
        max(window, 2 x min_samples) plays of the bucket, so that stale arms (each then played min_samples times)
        take at most half of a bucket's steps however small the window and many the arms."""
        plays, window = self.bucket_plays[bucket], self.config.window
        if plays - self.last_refresh[bucket] < max(window, 2 * self.config.min_samples):
            return None
        arms = self.arms[bucket]
        return next((name for name in names if plays - arms[name].last_play >= arms[name].stale_wait(window)), None)

    def _apply_hysteresis(self, bucket: int | None, choice: str) -> str:
        wants = PLAIN if choice == PLAIN else "sd"
        if wants == self.mode or self.steps_in_mode >= self.config.min_dwell_steps or self._in_probe_mode:
            return choice
        if self.mode == PLAIN or bucket is None:
            return PLAIN
        # Stay speculative: the best SD arm of this bucket.
        sd_arms = {n: a for n, a in self.arms[bucket].items() if n != PLAIN}
        return max(sd_arms, key=lambda n: (sd_arms[n].rate(), -list(sd_arms).index(n)))

    def _enter_mode(self, mode: str) -> None:
        first, self._stepped = not self._stepped, True
        if mode == self.mode:
            self.steps_in_mode = 1 if first else self.steps_in_mode + 1
            return
        self.mode, self.steps_in_mode = mode, 1
        if not first:  # the first step enters its mode; it switches from nothing
            self.num_mode_switches += 1
