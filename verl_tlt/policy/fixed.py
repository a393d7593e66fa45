"""A policy with nothing to learn: one strategy wherever the gate allows speculation, plain decoding elsewhere.

The baseline of every adaptive benchmark and the simulator's `fixed` and `sd_always` runs.
"""

from __future__ import annotations

from verl_tlt.policy.gate import SpeculationGate
from verl_tlt.spec.strategy import SpecStrategy


class FixedBelowThreshold:
    def __init__(self, strategy: str, threshold: int):
        """threshold 0: never speculate (a plain run through the same code)."""
        self.strategy = SpecStrategy.parse(strategy)
        self.gate = SpeculationGate(threshold)
        self.strategies = {self.strategy.name: self.strategy}  # what the engine checks a policy's strategies by

    @property
    def threshold(self) -> int:
        return self.gate.threshold

    def select(self, batch_size: int) -> SpecStrategy | None:
        return self.strategy if self.gate.speculates(batch_size) else None

    def observe(self, strategy: SpecStrategy | None, batch_size: int, committed_tokens: int, seconds: float) -> None:
        """Nothing to learn."""

    def bucket_of(self, batch_size: int) -> int | None:
        return self.gate.bucket_of(batch_size)
