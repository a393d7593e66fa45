"""How many tokens a speculative step commits per row, from a per-position acceptance probability.

A chain of k drafts whose positions are each accepted with probability alpha (independently, the usual model of
speculative decoding) commits the accepted prefix plus the target's own token: E = sum_{i=0..k} alpha^i =
(1 - alpha^(k+1)) / (1 - alpha). `committed_tokens` draws that count instead, for simulations that keep the spread.
"""

from __future__ import annotations

import random


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


def _check(alpha: float, depth: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"acceptance probability alpha must be in [0, 1], got {alpha}")
    if depth < 1:
        raise ValueError(f"draft depth must be >= 1, got {depth}")
