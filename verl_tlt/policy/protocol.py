"""What a rollout backend asks of a speculation policy, and what a policy reads from its settings.

The torch engine, TLT's vLLM scheduler, the simulator and the benchmarks drive any object of this shape:
``AdaptivePolicy`` (TLT's bandit) and ``FixedBelowThreshold`` (one strategy, nothing learnt) are the two here; a
benchmark may wrap either (to time it) as long as it keeps the shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from verl_tlt.policy.gate import SpeculationGate
from verl_tlt.spec.strategy import SpecStrategy


@runtime_checkable
class Policy(Protocol):
    gate: SpeculationGate  # where speculation is allowed, and the buckets of batch sizes
    strategies: Mapping[str, SpecStrategy]  # every SD strategy the policy may return (the engine checks they fit)

    @property
    def threshold(self) -> int: ...

    def select(self, batch_size: int) -> SpecStrategy | None:
        """The strategy of the next decode step of `batch_size` requests; None decodes plainly."""
        ...

    def observe(self, strategy: SpecStrategy | None, batch_size: int, committed_tokens: int, seconds: float) -> None:
        """A decode step finished: what it ran, how many requests, the tokens it committed, its seconds."""
        ...

    def bucket_of(self, batch_size: int) -> int | None:
        """The bucket (its lower bound) whose arms compete at `batch_size`; None above the threshold."""
        ...


class PolicySettings(Protocol):
    """The knobs of ``AdaptivePolicy``: ``config.SpeculativeConfig`` (``tlt.speculative``) is one, validated."""

    threshold: int
    buckets: tuple[int, ...]
    plain_arm_min_batch: int
    window: int
    min_samples: int
    epsilon: float
    probe_rate: float
    min_dwell_steps: int
    seed: int

    @property
    def arm_strategies(self) -> tuple[str, ...]: ...
