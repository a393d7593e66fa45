"""What each arm of the speculation policy is expected to deliver, before it has been played: TLT's costs known from
the first step.

A bandit that must play every arm before it knows anything speculates through most of a short RL run with a drafter
that cannot pay (measured: SmolLM2 with a drafter accepting 1.4-1.5 tokens spent 51% of its first step's decode steps
speculating, each a committed token at twice plain's cost). So each replica predicts every arm's rate from two things
it measures itself:

- **Step costs** (`StepCostTable`): seconds of one decode step per arm (plain, or an SD strategy: its draft passes
  and its verify forward together) at a handful of batch sizes, timed once when the replica's first drafter is
  loaded (`engine.step_costs`), interpolated linearly in the batch size between them. Steps timed there run short
  contexts; the plain steps the replica then decodes give the factor real contexts add (`context_factor`), applied
  to every arm, and each SD arm's own steps its factor over its prediction.
- **Acceptance** (`alpha`): the chance that a draft token is accepted given its predecessors were, first the
  drafter's self-test probe score (share of first greedy drafts the target agrees with, teacher-forced), then pooled
  with what the replica's SD steps committed (each strategy's tokens per verified row turned back into an alpha,
  weighted by rows, the probe counting as PRIOR_ROWS rows).

The predicted rate is the bandit's unit, committed tokens per request-second: 1 / T_plain(b) for plain, E / T_arm(b)
for a strategy, with E its expected tokens per verified row: for a chain of depth d, (1 - a^(d+1)) / (1 - a) (every
draft token right with probability a, the bonus token always); for a tree the same with a per-level alpha of
1 - (1 - a)^c, c = min(top_k, tree_tokens / depth) candidates a level (an estimate: the tree search spends its
budget unevenly). Only drafter arms are predicted: suffix drafts' acceptance has nothing to do with the drafter's.

Pure Python: no torch, so the vLLM scheduler and the simulator can use it too.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field

from verl_tlt.policy.gate import PLAIN
from verl_tlt.spec.strategy import SpecStrategy

# The probe's alpha counts as this many verified rows when pooled with the rows the replica's SD steps verify.
PRIOR_ROWS = 16
# Weight of a new step in the running cost factors (plain: context; SD arm: its own), per step.
FACTOR_RATE = 0.1


@dataclass(frozen=True)
class StepCostTable:
    """Seconds of one decode step per arm ('plain' or a strategy name) at the batch sizes timed."""

    seconds: Mapping[str, Mapping[int, float]]

    def __post_init__(self) -> None:
        if PLAIN not in self.seconds or not self.seconds[PLAIN]:
            raise ValueError("a step cost table needs plain decoding's step seconds")
        for arm, by_batch in self.seconds.items():
            bad = {b: s for b, s in by_batch.items() if b < 1 or not s > 0}
            if bad:
                raise ValueError(f"step costs of {arm!r} need batch sizes >= 1 and seconds > 0, got {bad}")

    def at(self, arm: str, batch_size: int) -> float | None:
        """Seconds of a step of `arm` at `batch_size`: linear between the batch sizes timed, the nearest one's seconds
        below the smallest (and everywhere when one size was timed), and extended along the last two points above the
        largest; None if `arm` was not timed."""
        by_batch = self.seconds.get(arm)
        if not by_batch:
            return None
        sizes = sorted(by_batch)
        if batch_size <= sizes[0] or len(sizes) == 1:
            return by_batch[sizes[0]]
        index = min(bisect_left(sizes, batch_size), len(sizes) - 1)
        low, high = sizes[index - 1], sizes[index]
        slope = (by_batch[high] - by_batch[low]) / (high - low)
        return max(by_batch[low] + slope * (batch_size - low), 1e-9)

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {arm: {str(b): s for b, s in sorted(by_batch.items())} for arm, by_batch in self.seconds.items()}


def expected_tokens(strategy: SpecStrategy, alpha: float) -> float:
    """Expected committed tokens per verified row of `strategy` for per-token acceptance `alpha` (module docstring)."""
    alpha = min(max(alpha, 0.0), 1.0)
    if not strategy.is_chain:
        candidates = min(strategy.top_k, max(1.0, strategy.tree_tokens / strategy.depth))
        alpha = 1.0 - (1.0 - alpha) ** candidates
    if alpha >= 1.0:
        return float(strategy.depth + 1)
    return (1.0 - alpha ** (strategy.depth + 1)) / (1.0 - alpha)


def alpha_for(strategy: SpecStrategy, tokens_per_row: float) -> float:
    """The alpha whose `expected_tokens` for `strategy` is `tokens_per_row` (bisection; clipped to [0, 1])."""
    if tokens_per_row <= 1.0:
        return 0.0
    if tokens_per_row >= strategy.depth + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(40):
        middle = (low + high) / 2
        if expected_tokens(strategy, middle) < tokens_per_row:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@dataclass
class CostModel:
    """One replica's predictions of every arm's rate (module docstring); `observe` refines them from its steps."""

    table: StepCostTable
    strategies: Mapping[str, SpecStrategy]
    prior_alpha: float | None = None  # the drafter's self-test probe score; None: not known yet
    context_factor: float = 1.0  # observed / timed seconds of plain steps
    arm_factors: dict[str, float] = field(default_factory=dict)  # an SD arm's observed / predicted seconds
    rows: dict[str, int] = field(default_factory=dict)  # verified rows per strategy since the drafter was loaded
    tokens: dict[str, int] = field(default_factory=dict)  # tokens those rows committed

    def new_drafter(self, probe_alpha: float | None) -> None:
        """A drafter was loaded (and probed): its acceptance starts from the probe; step costs stay (same shapes)."""
        self.prior_alpha = probe_alpha
        self.rows.clear()
        self.tokens.clear()

    @property
    def alpha(self) -> float | None:
        """The current acceptance estimate: the probe pooled with the verified rows since the load."""
        weights = {name: rows for name, rows in self.rows.items() if rows and name in self.strategies}
        if self.prior_alpha is None and not weights:
            return None
        total = (PRIOR_ROWS if self.prior_alpha is not None else 0) + sum(weights.values())
        pooled = PRIOR_ROWS * self.prior_alpha if self.prior_alpha is not None else 0.0
        for name, rows in weights.items():
            pooled += rows * alpha_for(self.strategies[name], self.tokens[name] / rows)
        return pooled / total

    def predicts(self, arm: str) -> bool:
        """Whether this model predicts `arm` (plain, or a drafter strategy it has timed)."""
        if arm == PLAIN:
            return True
        strategy = self.strategies.get(arm)
        return strategy is not None and strategy.source == "eagle" and arm in self.table.seconds

    def predicted_seconds(self, arm: str, batch_size: int) -> float | None:
        seconds = self.table.at(arm, batch_size)
        if seconds is None:
            return None
        return seconds * self.context_factor * (1.0 if arm == PLAIN else self.arm_factors.get(arm, 1.0))

    def predicted_rate(self, arm: str, batch_size: int) -> float | None:
        """Committed tokens per request-second of `arm` at `batch_size`; None where the model cannot say (an arm it
        does not predict, or a drafter arm before any acceptance is known)."""
        if not self.predicts(arm):
            return None
        seconds = self.predicted_seconds(arm, batch_size)
        if seconds is None:
            return None
        if arm == PLAIN:
            return 1.0 / seconds
        alpha = self.alpha
        if alpha is None:
            return None
        return expected_tokens(self.strategies[arm], alpha) / seconds

    def behind_plain(self, arm: str, batch_size: int, margin: float) -> bool:
        """Whether `arm` is predicted to deliver less than (1 - margin) x plain's rate at `batch_size` (False where
        either cannot be predicted)."""
        rate, plain = self.predicted_rate(arm, batch_size), self.predicted_rate(PLAIN, batch_size)
        return rate is not None and plain is not None and rate < (1.0 - margin) * plain

    def best_gain(self, batch_sizes: list[int]) -> tuple[float, str, int] | None:
        """The largest predicted rate / plain's over the drafter arms and `batch_sizes`, with its arm and batch size;
        None when nothing can be predicted."""
        best = None
        for batch_size in batch_sizes:
            plain = self.predicted_rate(PLAIN, batch_size)
            for arm in self.strategies:
                rate = self.predicted_rate(arm, batch_size)
                if rate is None or plain is None:
                    continue
                if best is None or rate / plain > best[0]:
                    best = (rate / plain, arm, batch_size)
        return best

    def observe(self, arm: str, batch_size: int, committed_tokens: int, seconds: float) -> None:
        """A rewarded decode step of `arm` (catch-up steps excluded, as the bandit excludes them)."""
        timed = self.table.at(arm, batch_size)
        if timed is None or seconds <= 0 or batch_size < 1:
            return
        if arm == PLAIN:
            self.context_factor += FACTOR_RATE * (seconds / timed - self.context_factor)
            return
        if not self.predicts(arm):
            return
        factor = self.arm_factors.get(arm, 1.0)
        self.arm_factors[arm] = factor + FACTOR_RATE * (seconds / (timed * self.context_factor) - factor)
        self.rows[arm] = self.rows.get(arm, 0) + batch_size
        self.tokens[arm] = self.tokens.get(arm, 0) + committed_tokens

    def state(self) -> dict:
        return {
            "alpha": self.alpha,
            "prior_alpha": self.prior_alpha,
            "context_factor": self.context_factor,
            "arm_factors": dict(self.arm_factors),
            "table": self.table.as_dict(),
        }
