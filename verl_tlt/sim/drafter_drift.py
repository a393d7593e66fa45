"""How good the drafter is at each RL step: the policy drifts away from it, spot training pulls it back.

Quality q in [0, 1] scales the drafted part of the acceptance length (`acceptance.scaled`). Every RL step the policy
moves, and a drafter that does not learn loses a share `drift_per_step` of its distance to `floor` (the quality of a
drafter far behind the policy; it keeps the format and the common words). A drafter trained online during the step's
idle GPU-seconds recovers towards `ceiling` (what a drafter trained on the current policy reaches): a share
1 - exp(-harvested / recover_gpu_s) of its distance, so `recover_gpu_s` GPU-seconds of training close 63% of the gap.
Training happens during step t's rollout on step t's data, so the gain shows from step t + 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DrafterDrift:
    start: float  # quality at step 0 (a warmed-up drafter)
    ceiling: float
    floor: float
    drift_per_step: float
    recover_gpu_s: float

    def __post_init__(self) -> None:
        if not 0 <= self.floor <= self.start <= 1 or not self.floor <= self.ceiling <= 1:
            raise ValueError(
                f"drafter drift needs 0 <= floor <= start <= 1 and floor <= ceiling <= 1, got floor={self.floor}, "
                f"start={self.start}, ceiling={self.ceiling}"
            )
        if not 0 <= self.drift_per_step <= 1 or self.recover_gpu_s <= 0:
            raise ValueError("drafter drift needs 0 <= drift_per_step <= 1 and recover_gpu_s > 0")

    def next_quality(self, quality: float, trained_gpu_s: float) -> float:
        """Quality at the next step: this step's training gain, then the next policy update's drift."""
        trained = quality + (self.ceiling - quality) * (1 - math.exp(-trained_gpu_s / self.recover_gpu_s))
        trained = max(trained, quality)  # training never makes it worse here
        return trained - (trained - self.floor) * self.drift_per_step
