"""How many tokens a speculative step commits per row.

A chain of k drafts whose positions are each accepted with probability alpha (independently, the usual model of
speculative decoding) commits the accepted prefix plus the target's own token: E = sum_{i=0..k} alpha^i =
(1 - alpha^(k+1)) / (1 - alpha). `committed_tokens` draws that count instead, for simulations that keep the spread.

Two models of a strategy's acceptance length (tokens committed per row per verify step):
- `ChainAcceptance`: a per-position probability per draft source (the drafter, 'eagle'; group drafts, 'suffix'),
  for the project's chains; a tree counts as a chain of its depth (a lower bound: its extra branches only help).
- `TableAcceptance`: measured acceptance lengths by (depth, verify tokens), e.g. a paper's published grid, for tree
  strategies whose gain over a chain a per-position model does not capture.
Both scale with a drafter quality q in [0, 1] (`scaled`): L = 1 + q (L - 1), the drafted part shrinking as the policy
drifts away from what the drafter learned (`verl_tlt.sim.drafter_drift`). Model-free drafts do not drift.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from verl_tlt.spec.strategy import EAGLE, SUFFIX, SpecStrategy


def expected_committed(alpha: float, depth: int) -> float:
    """Expected tokens a verify step of a chain of `depth` drafts commits per row (1 <= E <= depth + 1)."""
    _check(alpha, depth)
    if alpha == 1.0:
        return float(depth + 1)
    return (1.0 - alpha ** (depth + 1)) / (1.0 - alpha)


def committed_tokens(alpha: float, depth: int, rng: random.Random) -> int:
    """One draw of the tokens a chain of `depth` drafts commits: accepted drafts (geometric, capped) plus one."""
    _check(alpha, depth)
    accepted = 0
    while accepted < depth and rng.random() < alpha:
        accepted += 1
    return accepted + 1


def alpha_for_length(length: float, depth: int) -> float:
    """The per-position probability whose chain of `depth` drafts commits `length` tokens on average (bisection)."""
    if not 1.0 <= length <= depth + 1:
        raise ValueError(f"an acceptance length must be in [1, depth + 1] = [1, {depth + 1}], got {length}")
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if expected_committed(middle, depth) < length else (low, middle)
    return (low + high) / 2


def draw_with_mean(mean: float, depth: int, rng: random.Random) -> int:
    """One row's committed tokens for a strategy of `depth` levels whose mean is `mean`: a chain draw at the
    per-position probability with that mean."""
    return committed_tokens(alpha_for_length(min(mean, depth + 1.0), depth), depth, rng)


class Acceptance(Protocol):
    def expected(self, strategy: SpecStrategy) -> float:
        """Mean tokens a row commits in one verify step of `strategy`."""

    def draw(self, strategy: SpecStrategy, rng: random.Random) -> int:
        """One row's committed tokens, drawn with that mean."""

    def scaled(self, quality: float) -> Acceptance:
        """The same model with the drafter's drafted part scaled by `quality`."""


class _Scalable:
    quality: float

    def draw(self, strategy: SpecStrategy, rng: random.Random) -> int:
        return draw_with_mean(self.expected(strategy), strategy.depth, rng)

    def scaled(self, quality: float):
        if not 0.0 <= quality <= 1.0:
            raise ValueError(f"drafter quality must be in [0, 1], got {quality}")
        return replace(self, quality=quality)

    def _apply_quality(self, length: float, strategy: SpecStrategy) -> float:
        if strategy.source == SUFFIX:
            return length  # drafts copied from the group do not depend on the drafter
        return 1.0 + self.quality * (length - 1.0)


@dataclass(frozen=True)
class ChainAcceptance(_Scalable):
    """Per-position acceptance per source ('eagle', 'suffix'; a mixed chain uses the eagle one)."""

    alpha: Mapping[str, float]
    quality: float = 1.0

    def __post_init__(self) -> None:
        for source, alpha in self.alpha.items():
            if source not in (EAGLE, SUFFIX):
                raise ValueError(f"acceptance source must be '{EAGLE}' or '{SUFFIX}', got {source!r}")
            _check(alpha, 1)

    def expected(self, strategy: SpecStrategy) -> float:
        alpha = self.alpha.get(SUFFIX if strategy.source == SUFFIX else EAGLE, 0.0)
        return self._apply_quality(expected_committed(alpha, strategy.depth), strategy)


@dataclass(frozen=True)
class TableAcceptance(_Scalable):
    """Acceptance lengths measured by (depth, verify tokens): a strategy of another shape takes the nearest measured
    depth, interpolated linearly in verify tokens between that depth's entries (clamped at the ends)."""

    lengths: Mapping[tuple[int, int], float]
    quality: float = 1.0
    _rows: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError("TableAcceptance needs at least one (depth, verify tokens) -> acceptance length entry")
        for (depth, verify), length in self.lengths.items():
            if not 1.0 <= length <= depth + 1:
                raise ValueError(
                    f"acceptance length {length} at depth {depth}, verify {verify} is outside [1, depth + 1]"
                )
            self._rows.setdefault(depth, []).append((verify, length))
        for row in self._rows.values():
            row.sort()

    def expected(self, strategy: SpecStrategy) -> float:
        depth = min(self._rows, key=lambda d: (abs(d - strategy.depth), d))
        row = self._rows[depth]
        verifies = [verify for verify, _ in row]
        at = bisect.bisect_left(verifies, strategy.tree_tokens)
        if at == 0:
            length = row[0][1]
        elif at == len(row):
            length = row[-1][1]
        else:
            (v0, l0), (v1, l1) = row[at - 1], row[at]
            length = l0 + (l1 - l0) * (strategy.tree_tokens - v0) / (v1 - v0)
        return min(self._apply_quality(length, strategy), strategy.depth + 1.0)


def as_acceptance(value: Acceptance | float | Mapping[str, float]) -> Acceptance:
    """An acceptance model from a model, one per-position probability, or one per source."""
    if isinstance(value, (int, float)):
        return ChainAcceptance({EAGLE: float(value), SUFFIX: float(value)})
    if isinstance(value, Mapping):
        return ChainAcceptance(dict(value))
    return value


def _check(alpha: float, depth: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"acceptance probability alpha must be in [0, 1], got {alpha}")
    if depth < 1:
        raise ValueError(f"draft depth must be >= 1, got {depth}")
