"""The rollout of one synchronous RL step, replica by replica and decode step by decode step.

Every replica gets its share of the step's requests (round robin here; `simulate_replica` takes a replica's own list,
as the calibration replays recorded ones) and decodes them with continuous batching: at most `max_num_seqs` run, the
others wait for a slot, and a request that has not arrived yet (`arrivals`) waits for its arrival. A step that admits
requests is a prefill step (`prefill_s`); every other step decodes the running batch. A step model says what a decode
step of a given batch costs and commits per row: `PolicySteps` asks a policy (plain or a speculative strategy) and
a cost and acceptance model; the calibration's measured steps replay a real run. Replicas do not wait for one another,
so the rollout ends when the slowest replica drains; the time the others sit drained is what spot training can use.

The policy is any object with `select(batch_size) -> SpecStrategy | None` and `observe(strategy, batch_size,
committed_tokens, seconds)`, such as `verl_tlt.engine.adaptive.AdaptivePolicy`, one per replica.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from verl_tlt.sim.acceptance import committed_tokens, expected_committed
from verl_tlt.sim.costs import SpeculativeCost
from verl_tlt.spec.strategy import EAGLE, SUFFIX, SpecStrategy

PLAIN = "plain"


class StepModel(Protocol):
    def step(self, batch: int) -> tuple[float, list[float], str]:
        """A decode step of `batch` running rows: (seconds, tokens each row commits, arm name)."""

    def observe(self, batch: int, committed: float, seconds: float) -> None:
        """What the step did (a policy learns from it)."""


@dataclass(frozen=True)
class StepRecord:
    """One step of one replica: when it started, how long it took, its batch, what it ran, what it committed."""

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


class PolicySteps:
    """Steps chosen by a policy (None: always plain), priced by a cost model, committing by an acceptance model.

    acceptance: per-position acceptance probability of drafts, one for every source or one per source ('eagle',
    'suffix'; a mixed chain uses the eagle one; a tree counts as a chain of its depth). rng: draw each row's committed
    tokens (None: every row commits the expected count, so results are exact and reproducible).
    """

    def __init__(
        self,
        cost: SpeculativeCost,
        policy: Any = None,
        acceptance: float | Mapping[str, float] = 0.0,
        rng: random.Random | None = None,
    ):
        self.cost, self.policy, self.acceptance, self.rng = cost, policy, acceptance, rng
        self._strategy: SpecStrategy | None = None

    def step(self, batch: int) -> tuple[float, list[float], str]:
        strategy = self._strategy = self.policy.select(batch) if self.policy is not None else None
        if strategy is None:
            return self.cost.plain_seconds(batch), [1.0] * batch, PLAIN
        seconds = self.cost.speculative_seconds(
            batch, strategy.depth, strategy.tree_tokens, drafts_with_model=strategy.uses_drafter
        )
        return seconds, [self._committed(strategy) for _ in range(batch)], strategy.name

    def observe(self, batch: int, committed: float, seconds: float) -> None:
        if self.policy is not None:
            self.policy.observe(self._strategy, batch, round(committed), seconds)

    def _committed(self, strategy: SpecStrategy) -> float:
        source = SUFFIX if strategy.source == SUFFIX else EAGLE
        alpha = self.acceptance if isinstance(self.acceptance, (int, float)) else self.acceptance.get(source, 0.0)
        if self.rng is None:
            return expected_committed(float(alpha), strategy.depth)
        return float(committed_tokens(float(alpha), strategy.depth, self.rng))


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
    """Decode requests of the given response lengths (tokens), all there at the start, on `replicas` replicas
    (round robin), each with its own policy from `policy_factory` (see PolicySteps for acceptance and rng)."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    finish_s = [0.0] * len(lengths)
    timelines = []
    for replica in range(replicas):
        mine = list(range(replica, len(lengths), replicas))
        steps = PolicySteps(cost, policy_factory() if policy_factory is not None else None, acceptance, rng)
        timeline, finishes = simulate_replica([lengths[i] for i in mine], steps, max_num_seqs=max_num_seqs)
        for request, finished in zip(mine, finishes, strict=True):
            finish_s[request] = finished
        timelines.append(timeline)
    return RolloutResult(finish_s, timelines)


def simulate_replica(
    lengths: Sequence[int],
    steps: StepModel,
    *,
    arrivals: Sequence[float] | None = None,
    max_num_seqs: int = 256,
    prefill_s: float | None = None,
) -> tuple[ReplicaTimeline, list[float]]:
    """One replica decoding requests of `lengths` that arrive at `arrivals` (seconds; default all at 0), admitted in
    arrival order; returns its timeline and each request's finish time.

    prefill_s: None leaves prefill out (every token comes from a decode step); a number makes each admission a step
    of that many seconds that emits the admitted requests' first tokens and nothing else, as the torch engine does.
    """
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    if any(length < 1 for length in lengths):
        raise ValueError("every response length must be >= 1 token")
    arrivals = [0.0] * len(lengths) if arrivals is None else list(arrivals)
    order = sorted(range(len(lengths)), key=lambda request: arrivals[request])
    timeline, finish_s = ReplicaTimeline(), [0.0] * len(lengths)
    running: dict[int, float] = {}  # request -> tokens still to decode
    now, next_arrival = 0.0, 0
    while running or next_arrival < len(order):
        if not running and arrivals[order[next_arrival]] > now:
            now = arrivals[order[next_arrival]]  # nothing to do until the next request arrives
        admitted = 0
        while next_arrival < len(order) and len(running) < max_num_seqs and arrivals[order[next_arrival]] <= now:
            running[order[next_arrival]] = float(lengths[order[next_arrival]])
            next_arrival += 1
            admitted += 1
        if admitted and prefill_s is not None:
            now = _prefill(running, admitted, prefill_s, now, timeline, finish_s)
            continue
        batch = len(running)
        seconds, per_row, arm = steps.step(batch)
        committed = 0.0
        for request, tokens in zip(list(running), per_row, strict=True):
            taken = min(tokens, running[request])
            committed += taken
            running[request] -= taken
            if running[request] <= 1e-9:
                del running[request]
                finish_s[request] = now + seconds
        timeline.steps.append(StepRecord(now, seconds, batch, arm, committed))
        steps.observe(batch, committed, seconds)
        now += seconds
    timeline.drained_s = now
    return timeline, finish_s


def _prefill(
    running: dict[int, float], admitted: int, seconds: float, now: float, timeline: ReplicaTimeline, finish_s: list
) -> float:
    """The prefill step of the last `admitted` requests of `running`: each gets its first token; returns the time
    after it."""
    for request in list(running)[-admitted:]:
        running[request] -= 1.0
        if running[request] <= 1e-9:
            del running[request]
            finish_s[request] = now + seconds
    timeline.steps.append(StepRecord(now, seconds, admitted, "prefill", float(admitted)))
    return now + seconds
