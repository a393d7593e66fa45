"""The rollout of one synchronous RL step, replica by replica and decode step by decode step.

Every replica gets its share of the step's requests up front (verl hands a synchronous rollout's requests out at
once; round robin here) and decodes them with continuous batching: at most `max_num_seqs` run, the others wait for a
slot. A decode step's batch is the number of running requests; the replica's policy (none: always plain) picks plain
decoding or a speculative strategy for it; the cost model gives its seconds, and the acceptance model the tokens it
commits per row. Replicas do not wait for one another, so the rollout ends when the slowest replica drains; the time
the others sit drained is what TLT's spot training can use.

Prefill is not modelled (the prompts of a reasoning rollout are short beside its answers); the policy is any object
with `select(batch_size) -> SpecStrategy | None` and `observe(strategy, batch_size, committed_tokens, seconds)`, such
as `verl_tlt.engine.adaptive.AdaptivePolicy`, one per replica (`policy_factory`).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_tlt.sim.acceptance import committed_tokens, expected_committed
from verl_tlt.sim.costs import SpeculativeCost
from verl_tlt.spec.strategy import EAGLE, SUFFIX, SpecStrategy

PLAIN = "plain"


@dataclass(frozen=True)
class StepRecord:
    """One decode step of one replica: when it started, how long it took, its batch, what it ran, what it committed."""

    start_s: float
    seconds: float
    batch: int
    arm: str
    committed: float


@dataclass
class ReplicaTimeline:
    """What one replica did: its steps in order and when its last request finished (0 without requests)."""

    steps: list[StepRecord] = field(default_factory=list)
    drained_s: float = 0.0

    @property
    def busy_s(self) -> float:
        return sum(step.seconds for step in self.steps)


@dataclass
class RolloutResult:
    """finish_s[i]: when request i finished; replicas: each replica's timeline. time_s: the rollout's length."""

    finish_s: list[float]
    replicas: list[ReplicaTimeline]

    @property
    def time_s(self) -> float:
        return max((replica.drained_s for replica in self.replicas), default=0.0)

    @property
    def idle_replica_s(self) -> float:
        """Replica-seconds spent drained while another replica still decoded (what spot training can harvest)."""
        return sum(self.time_s - replica.drained_s for replica in self.replicas)


def simulate_rollout(
    lengths: Sequence[int],
    cost: SpeculativeCost,
    *,
    replicas: int = 1,
    max_num_seqs: int = 256,
    policy_factory: Callable[[], Any] | None = None,
    acceptance: float | Mapping[str, float] = 0.0,
    rng: random.Random | None = None,
) -> RolloutResult:
    """Decode requests of the given response lengths (tokens) on `replicas` replicas; see the module docstring.

    acceptance: per-position acceptance probability of drafts, one for every source or one per source ('eagle',
    'suffix'; a mixed chain uses the eagle one). rng: draw each row's committed tokens (None: every row commits the
    expected count, so results are exact and reproducible).
    """
    if replicas < 1 or max_num_seqs < 1:
        raise ValueError(f"replicas and max_num_seqs must be >= 1, got {replicas} and {max_num_seqs}")
    if any(length < 1 for length in lengths):
        raise ValueError("every response length must be >= 1 token")
    finish_s = [0.0] * len(lengths)
    timelines = []
    for replica in range(replicas):
        mine = list(range(replica, len(lengths), replicas))  # round robin
        policy = policy_factory() if policy_factory is not None else None
        timelines.append(_decode_replica(mine, lengths, cost, max_num_seqs, policy, acceptance, rng, finish_s))
    return RolloutResult(finish_s, timelines)


def _decode_replica(
    requests: list[int],
    lengths: Sequence[int],
    cost: SpeculativeCost,
    max_num_seqs: int,
    policy: Any,
    acceptance: float | Mapping[str, float],
    rng: random.Random | None,
    finish_s: list[float],
) -> ReplicaTimeline:
    timeline = ReplicaTimeline()
    waiting = deque(requests)
    running: dict[int, float] = {}  # request -> tokens still to decode
    now = 0.0
    while running or waiting:
        while waiting and len(running) < max_num_seqs:
            request = waiting.popleft()
            running[request] = float(lengths[request])
        batch = len(running)
        strategy = policy.select(batch) if policy is not None else None
        if strategy is None:
            seconds = cost.plain_seconds(batch)
            per_row = {request: 1.0 for request in running}
        else:
            seconds = _speculative_seconds(cost, batch, strategy)
            per_row = {request: _committed(strategy, acceptance, rng) for request in running}
        committed = 0.0
        for request in list(running):
            taken = min(per_row[request], running[request])
            committed += taken
            running[request] -= taken
            if running[request] <= 1e-9:
                del running[request]
                finish_s[request] = now + seconds
        timeline.steps.append(StepRecord(now, seconds, batch, PLAIN if strategy is None else strategy.name, committed))
        if policy is not None:
            policy.observe(strategy, batch, round(committed), seconds)
        now += seconds
    timeline.drained_s = now
    return timeline


def _speculative_seconds(cost: SpeculativeCost, batch: int, strategy: SpecStrategy) -> float:
    return cost.speculative_seconds(
        batch, strategy.depth, strategy.tree_tokens, drafts_with_model=strategy.uses_drafter
    )


def _committed(strategy: SpecStrategy, acceptance: float | Mapping[str, float], rng: random.Random | None) -> float:
    """Tokens one row commits in a speculative step: a tree is modelled as a chain of its depth."""
    source = SUFFIX if strategy.source == SUFFIX else EAGLE
    alpha = acceptance if isinstance(acceptance, (int, float)) else acceptance.get(source, 0.0)
    if rng is None:
        return expected_committed(float(alpha), strategy.depth)
    return float(committed_tokens(float(alpha), strategy.depth, rng))
