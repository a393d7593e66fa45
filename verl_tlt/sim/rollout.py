"""The rollout of one synchronous RL step, replica by replica and decode step by decode step.

Every replica gets its share of the step's requests (round robin here; `simulate_replica` takes a replica's own list,
as the calibration replays recorded ones) and decodes them with continuous batching: at most `max_num_seqs` run, the
others wait for a slot, and a request that has not arrived yet (`arrivals`) waits for its arrival. A step that admits
requests is a prefill step (`prefill_s`); every other step decodes the running batch. A step model says what a decode
step of a given batch (and KV-cache size) costs and commits per row: `PolicySteps` asks a policy (plain or a
speculative strategy) and a cost and acceptance model; the calibration's measured steps replay a real run. Replicas do
not wait for one another, so the rollout ends when the slowest replica drains; the time the others sit drained is
what spot training can use.

Speed: a step model that commits the same count on every row (expected acceptance) lets the replica track one shared
progress counter and a heap of finish marks instead of touching every row; and where the model says a batch's steps
do not depend on history (`steady`: plain decoding above the threshold), the steps up to the next finish or arrival
are taken at once, priced at the middle KV size (exact for a cost linear in the KV size). A 32k-token rollout of
hundreds of requests then costs milliseconds, not seconds.

The policy is any object with `select(batch_size) -> SpecStrategy | None` and `observe(strategy, batch_size,
committed_tokens, seconds)`, such as `verl_tlt.policy.adaptive.AdaptivePolicy`, one per replica.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from verl_tlt.policy import PLAIN
from verl_tlt.sim.acceptance import Acceptance, as_acceptance
from verl_tlt.sim.costs import SpeculativeCost

PREFILL = "prefill"


class StepModel(Protocol):
    def step(self, batch: int, kv_tokens: int = 0) -> tuple[float, float | list[float], str]:
        """A decode step of `batch` running rows holding `kv_tokens` cached tokens: (seconds, tokens each row
        commits (one number when every row commits the same), arm name)."""

    def observe(self, batch: int, committed: float, seconds: float) -> None:
        """What the step did (a policy learns from it)."""


@dataclass(frozen=True)
class StepRecord:
    """`count` equal steps of one replica from `start_s`: each `seconds` long at `batch` rows, running `arm`;
    `committed`: tokens committed by all of them together."""

    start_s: float
    seconds: float
    batch: int
    arm: str
    committed: float
    count: int = 1

    @property
    def end_s(self) -> float:
        return self.start_s + self.seconds * self.count


@dataclass
class ReplicaTimeline:
    """What one replica did: its steps in order and when its last request finished (0 without requests)."""

    steps: list[StepRecord] = field(default_factory=list)
    drained_s: float = 0.0

    @property
    def busy_s(self) -> float:
        return sum(step.seconds * step.count for step in self.steps)

    def seconds_by_arm(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for step in self.steps:
            totals[step.arm] = totals.get(step.arm, 0.0) + step.seconds * step.count
        return totals


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

    acceptance: an `Acceptance` model, or a per-position acceptance probability of chain drafts (one for every
    source, or one per source: 'eagle', 'suffix'). rng: draw each row's committed tokens (None: every row commits the
    expected count, so results are exact and reproducible, and the fast path applies).
    """

    def __init__(
        self,
        cost: SpeculativeCost,
        policy: Any = None,
        acceptance: Acceptance | float | Mapping[str, float] = 0.0,
        rng: random.Random | None = None,
    ):
        self.cost, self.policy, self.rng = cost, policy, rng
        self.acceptance = as_acceptance(acceptance)
        self._strategy = None
        # Plain where the policy's gate does not speculate is the policy protocol's contract (`verl_tlt.policy`).
        self._gate = getattr(policy, "gate", None)

    def steady(self, batch: int) -> bool:
        return self.policy is None or (self._gate is not None and not self._gate.speculates(batch))

    def step(self, batch: int, kv_tokens: int = 0) -> tuple[float, float | list[float], str]:
        strategy = self._strategy = self.policy.select(batch) if self.policy is not None else None
        if strategy is None:
            return self.cost.plain_seconds(batch, kv_tokens), 1.0, PLAIN
        seconds = self.cost.speculative_seconds(
            batch,
            strategy.depth,
            strategy.tree_tokens,
            drafts_with_model=strategy.uses_drafter,
            kv_tokens=kv_tokens,
            top_k=strategy.top_k,
        )
        if self.rng is None:
            return seconds, self.acceptance.expected(strategy), strategy.name
        return seconds, [float(self.acceptance.draw(strategy, self.rng)) for _ in range(batch)], strategy.name

    def skip(self, batch: int, steps: int) -> None:
        """`steps` more plain steps were taken at once after `step`: the policy counts them as played (its dwell in
        a mode is counted in steps), without the per-step calls."""
        if self.policy is not None and steps > 0 and hasattr(self.policy, "steps_in_mode"):
            self.policy.steps_in_mode += steps

    def observe(self, batch: int, committed: float, seconds: float) -> None:
        if self.policy is not None:
            self.policy.observe(self._strategy, batch, round(committed), seconds)


def simulate_rollout(
    lengths: Sequence[int],
    cost: SpeculativeCost,
    *,
    replicas: int = 1,
    max_num_seqs: int = 256,
    policy_factory: Callable[[], Any] | None = None,
    acceptance: Acceptance | float | Mapping[str, float] = 0.0,
    rng: random.Random | None = None,
    prompt_tokens: Sequence[int] | int = 0,
) -> RolloutResult:
    """Decode requests of the given response lengths (tokens), all there at the start, on `replicas` replicas
    (round robin), each with its own policy from `policy_factory` (see PolicySteps for acceptance and rng).
    prompt_tokens: each request's prompt length (one number for all), counted in the KV cache."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    prompts = [prompt_tokens] * len(lengths) if isinstance(prompt_tokens, int) else list(prompt_tokens)
    finish_s = [0.0] * len(lengths)
    timelines = []
    for replica in range(replicas):
        mine = list(range(replica, len(lengths), replicas))
        steps = PolicySteps(cost, policy_factory() if policy_factory is not None else None, acceptance, rng)
        timeline, finishes = simulate_replica(
            [lengths[i] for i in mine], steps, max_num_seqs=max_num_seqs, prompt_tokens=[prompts[i] for i in mine]
        )
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
    prompt_tokens: Sequence[int] | None = None,
) -> tuple[ReplicaTimeline, list[float]]:
    """One replica decoding requests of `lengths` that arrive at `arrivals` (seconds; default all at 0), admitted in
    arrival order; returns its timeline and each request's finish time.

    prefill_s: None leaves prefill out (every token comes from a decode step); a number makes each admission a step
    of that many seconds that emits the admitted requests' first tokens and nothing else, as the torch engine does.
    prompt_tokens: each request's prompt length, in the KV cache from its admission (default 0).
    """
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    if any(length < 1 for length in lengths):
        raise ValueError("every response length must be >= 1 token")
    return _Replica(lengths, steps, arrivals, max_num_seqs, prefill_s, prompt_tokens).run()


class _Replica:
    """The state of one replica's decoding. Rows are tracked against a shared counter `progress` (tokens every
    running row has committed since the replica started): a row admitted at progress p with n tokens to go finishes
    when progress reaches p + n. Steps that commit different counts per row fall back to per-row bookkeeping."""

    def __init__(self, lengths, steps, arrivals, max_num_seqs, prefill_s, prompt_tokens):
        self.lengths, self.steps, self.max_num_seqs, self.prefill_s = lengths, steps, max_num_seqs, prefill_s
        self.arrivals = [0.0] * len(lengths) if arrivals is None else list(arrivals)
        self.prompts = [0] * len(lengths) if prompt_tokens is None else list(prompt_tokens)
        self.order = sorted(range(len(lengths)), key=lambda request: self.arrivals[request])
        self.timeline, self.finish_s = ReplicaTimeline(), [0.0] * len(lengths)
        self.marks: list[tuple[float, int]] = []  # heap of (progress at which the row finishes, request)
        self.start_progress: dict[int, float] = {}  # running request -> progress when admitted
        self.progress, self.now, self.next_arrival = 0.0, 0.0, 0
        self.kv_base = 0.0  # sum over running rows of (prompt - start progress): kv = kv_base + batch * progress

    def run(self) -> tuple[ReplicaTimeline, list[float]]:
        while self.marks or self.next_arrival < len(self.order):
            if not self.marks and self.arrivals[self.order[self.next_arrival]] > self.now:
                self.now = self.arrivals[self.order[self.next_arrival]]  # idle until the next request arrives
            admitted = self._admit()
            if admitted and self.prefill_s is not None:
                self._prefill(admitted)
                continue
            self._decode()
        self.timeline.drained_s = self.now
        return self.timeline, self.finish_s

    def _admit(self) -> list[int]:
        admitted = []
        while (
            self.next_arrival < len(self.order)
            and len(self.marks) < self.max_num_seqs
            and self.arrivals[self.order[self.next_arrival]] <= self.now
        ):
            request = self.order[self.next_arrival]
            self.next_arrival += 1
            self.start_progress[request] = self.progress
            self.kv_base += self.prompts[request] - self.progress
            heapq.heappush(self.marks, (self.progress + self.lengths[request], request))
            admitted.append(request)
        return admitted

    def _prefill(self, admitted: list[int]) -> None:
        """The admitted rows get their first token (their marks move one token closer)."""
        marks = {request for request in admitted}
        self.marks = [(mark - 1.0 if request in marks else mark, request) for mark, request in self.marks]
        heapq.heapify(self.marks)
        self.now += self.prefill_s
        self.timeline.steps.append(
            StepRecord(self.now - self.prefill_s, self.prefill_s, len(admitted), PREFILL, float(len(admitted)))
        )
        self._finish_done()

    def _kv_tokens(self) -> float:
        return max(0.0, self.kv_base + len(self.marks) * self.progress)

    def _decode(self) -> None:
        batch = len(self.marks)
        seconds, per_row, arm = self.steps.step(batch, self._kv_tokens())
        if isinstance(per_row, (int, float)):
            run = self._steady_run(batch, per_row)
            if run > 1:
                self._take_steady_run(batch, seconds, float(per_row), arm, run)
                return
            committed = self._advance_all(float(per_row))
        else:
            committed = self._advance_rows(per_row)
        self.timeline.steps.append(StepRecord(self.now, seconds, batch, arm, committed))
        self.steps.observe(batch, committed, seconds)
        self.now += seconds
        self._finish_done()

    def _steady_run(self, batch: int, per_row: float) -> int:
        """How many equal steps can be taken at once: up to the step that finishes the next row."""
        steady = getattr(self.steps, "steady", None)
        if steady is None or not steady(batch) or per_row <= 0:
            return 1
        return max(1, math.ceil((self.marks[0][0] - self.progress) / per_row - 1e-9))

    def _take_steady_run(self, batch: int, first_s: float, per_row: float, arm: str, run: int) -> None:
        """`run` equal steps; an arrival that could be admitted ends the run early."""
        if self.next_arrival < len(self.order) and batch < self.max_num_seqs:
            pending = self.arrivals[self.order[self.next_arrival]]
            run = max(1, min(run, math.ceil((pending - self.now) / first_s))) if first_s > 0 else 1
        seconds = first_s
        if run > 1:
            # Priced at the run's middle KV size (the mean of its steps' sizes; not rounded), which asks the model
            # again: the policy has now been asked twice and is told of the other run - 2 steps.
            middle_kv = self._kv_tokens() + batch * per_row * (run - 1) / 2
            seconds = self.steps.step(batch, middle_kv)[0]
            if hasattr(self.steps, "skip"):
                self.steps.skip(batch, run - 2)
        committed = self._advance_all(per_row * run)
        self.timeline.steps.append(StepRecord(self.now, seconds, batch, arm, committed, run))
        self.now += seconds * run
        self._finish_done()

    def _advance_all(self, tokens: float) -> float:
        """Every running row commits `tokens` (capped by what each has left); returns the tokens committed."""
        committed = 0.0
        for mark, _ in self.marks:
            committed += min(tokens, max(0.0, mark - self.progress))
        self.progress += tokens
        return committed

    def _advance_rows(self, per_row: list[float]) -> float:
        """Rows commit different counts: each row's mark moves by what the others gained over it."""
        mean = sum(per_row) / len(per_row)
        rows = sorted(self.marks, key=lambda item: item[1])
        committed, moved = 0.0, []
        for (mark, request), tokens in zip(rows, per_row, strict=True):
            committed += min(tokens, max(0.0, mark - self.progress))
            lag = mean - tokens  # the row fell behind the shared counter by this much (ahead when negative)
            moved.append((mark + lag, request))
            self.start_progress[request] += lag
            self.kv_base -= lag
        self.progress += mean
        self.marks = moved
        heapq.heapify(self.marks)
        return committed

    def _finish_done(self) -> None:
        while self.marks and self.marks[0][0] <= self.progress + 1e-9:
            _, request = heapq.heappop(self.marks)
            self.kv_base -= self.prompts[request] - self.start_progress.pop(request)
            self.finish_s[request] = self.now
