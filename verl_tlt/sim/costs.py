"""Seconds per decode step of one rollout replica: plain steps, verify steps and the drafter's steps.

A step's cost depends on the running batch, on the tokens each row feeds the target (1 for plain decoding, depth + 1
to verify a chain, tree tokens + 1 for a tree) and on the KV cache the step reads. Any object with
`step_seconds(batch, width=1, kv_tokens=0)` is a target cost model: `LinearCost` here (a fixed part, a part per
token processed and a part per cached token), `RooflineCost` (`roofline.py`, bytes over bandwidth and FLOPs over
peak) and `MeasuredCost` (`measured_cost.py`, a benchmark's table). `SpeculativeCost` adds the drafter: one drafter
step per draft level, either a fraction of a plain target step at the same batch or a cost model of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class StepCost(Protocol):
    def step_seconds(self, batch: int, width: int = 1, kv_tokens: int = 0) -> float:
        """Seconds of one forward over `batch` rows of `width` tokens each, reading `kv_tokens` cached tokens."""


@dataclass(frozen=True)
class LinearCost:
    """t(batch, width, kv) = fixed_s + per_token_s * batch * width + per_kv_token_s * kv."""

    fixed_s: float
    per_token_s: float = 0.0
    per_kv_token_s: float = 0.0

    def __post_init__(self) -> None:
        if min(self.fixed_s, self.per_token_s, self.per_kv_token_s) < 0 or self.fixed_s + self.per_token_s <= 0:
            raise ValueError(
                f"LinearCost needs fixed_s, per_token_s, per_kv_token_s >= 0 and fixed_s + per_token_s > 0; got "
                f"fixed_s={self.fixed_s}, per_token_s={self.per_token_s}, per_kv_token_s={self.per_kv_token_s}"
            )

    def step_seconds(self, batch: int, width: int = 1, kv_tokens: int = 0) -> float:
        """Seconds of one target forward over `batch` rows of `width` tokens each."""
        check_step(batch, width)
        return self.fixed_s + self.per_token_s * batch * width + self.per_kv_token_s * kv_tokens


@dataclass(frozen=True)
class SpeculativeCost:
    """A target cost model plus the drafter. A strategy of `depth` draft levels costs `depth` drafter steps, then one
    verify forward of width verify_tokens + 1. A drafter step costs `drafter_fraction` of a plain target step at the
    same batch, or, with a `drafter` cost model, that model's step over batch * top_k rows (a tree expands top_k
    nodes per row and level)."""

    target: Any  # a StepCost
    drafter_fraction: float = 0.0
    drafter: Any = None  # a StepCost for one drafter level, or None

    def __post_init__(self) -> None:
        if self.drafter_fraction < 0:
            raise ValueError(f"drafter_fraction must be >= 0, got {self.drafter_fraction}")

    def plain_seconds(self, batch: int, kv_tokens: int = 0) -> float:
        return self.target.step_seconds(batch, 1, kv_tokens)

    def speculative_seconds(
        self,
        batch: int,
        draft_levels: int,
        verify_tokens: int | None = None,
        drafts_with_model: bool = True,
        kv_tokens: int = 0,
        top_k: int = 1,
    ) -> float:
        """One speculative step: `draft_levels` drafter steps (none for model-free drafts), then one target forward
        verifying `verify_tokens` drafts per row (default: draft_levels, a chain) plus the last committed token."""
        verify_tokens = draft_levels if verify_tokens is None else verify_tokens
        drafting = 0.0
        if drafts_with_model:
            if self.drafter is not None:
                drafting = draft_levels * self.drafter.step_seconds(batch * top_k, 1, 0)
            else:
                drafting = draft_levels * self.drafter_fraction * self.plain_seconds(batch, kv_tokens)
        return drafting + self.target.step_seconds(batch, verify_tokens + 1, kv_tokens)


def check_step(batch: int, width: int) -> None:
    if batch < 1 or width < 1:
        raise ValueError(f"a decode step needs batch >= 1 and width >= 1, got batch={batch}, width={width}")
