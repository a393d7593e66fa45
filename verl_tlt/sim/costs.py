"""Seconds per decode step of one rollout replica: plain steps, verify steps and the drafter's steps.

A step's cost depends on the running batch and on the tokens each row feeds the target (1 for plain decoding,
depth + 1 to verify a chain). `LinearCost` is the simplest model with both effects: a fixed part (reading the
weights, launching kernels) and a part per token processed. `SpeculativeCost` adds the drafter: one drafter step per
draft level, each a fraction of a plain target step at the same batch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearCost:
    """t(batch, width) = fixed_s + per_token_s * batch * width."""

    fixed_s: float
    per_token_s: float = 0.0

    def __post_init__(self) -> None:
        if self.fixed_s < 0 or self.per_token_s < 0 or self.fixed_s + self.per_token_s <= 0:
            raise ValueError(
                f"LinearCost needs fixed_s >= 0 and per_token_s >= 0, not both 0; got fixed_s={self.fixed_s}, "
                f"per_token_s={self.per_token_s}"
            )

    def step_seconds(self, batch: int, width: int = 1) -> float:
        """Seconds of one target forward over `batch` rows of `width` tokens each."""
        _check_step(batch, width)
        return self.fixed_s + self.per_token_s * batch * width


@dataclass(frozen=True)
class SpeculativeCost:
    """A target cost model plus the drafter: a chain of `depth` drafts costs depth drafter steps, each
    `drafter_fraction` of a plain target step at the same batch, then one verify forward of width depth + 1."""

    target: LinearCost
    drafter_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.drafter_fraction < 0:
            raise ValueError(f"drafter_fraction must be >= 0, got {self.drafter_fraction}")

    def plain_seconds(self, batch: int) -> float:
        return self.target.step_seconds(batch, 1)

    def speculative_seconds(
        self, batch: int, draft_levels: int, verify_tokens: int | None = None, drafts_with_model: bool = True
    ) -> float:
        """One speculative step: `draft_levels` drafter steps (none for model-free drafts), then one target forward
        verifying `verify_tokens` drafts per row (default: draft_levels, a chain) plus the last committed token."""
        verify_tokens = draft_levels if verify_tokens is None else verify_tokens
        drafting = draft_levels * self.drafter_fraction * self.plain_seconds(batch) if drafts_with_model else 0.0
        return drafting + self.target.step_seconds(batch, verify_tokens + 1)


def _check_step(batch: int, width: int) -> None:
    if batch < 1 or width < 1:
        raise ValueError(f"a decode step needs batch >= 1 and width >= 1, got batch={batch}, width={width}")
