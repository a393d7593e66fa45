"""When to spot-train the drafter during a rollout: as soon as a replica has drained while others still generate.

`SpotSchedule` is the coordinator's decision logic, free of Ray and verl so it can be tested exactly. The
coordinator polls each replica's in-flight request count and feeds it to `observe(in_flight, now)`, which
returns "start", "stop" or None:
- "start" when at least `min_idle_replicas` replicas have drained (0 in flight, having served this rollout) while
  at least one other is still generating: their resources would otherwise wait for the slowest responses;
- "stop" when every replica has drained (the rollout is over and the resources are needed again).
It also accounts idle replica-seconds (a drained replica waiting for others) and how many of them overlapped with
training, for the `tlt/spot/*` metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class SpotStats:
    idle_replica_seconds: float = 0.0
    trained_replica_seconds: float = 0.0
    training_seconds: float = 0.0
    num_starts: int = 0

    @property
    def idle_share_used(self) -> float:
        return self.trained_replica_seconds / self.idle_replica_seconds if self.idle_replica_seconds else 0.0


class SpotSchedule:
    def __init__(self, num_replicas: int, min_idle_replicas: int = 1):
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if not 1 <= min_idle_replicas <= num_replicas:
            raise ValueError(f"min_idle_replicas must be in [1, {num_replicas}], got {min_idle_replicas}")
        self.num_replicas, self.min_idle_replicas = num_replicas, min_idle_replicas
        self.reset()

    def reset(self) -> None:
        """Begin a new rollout."""
        self.served = [False] * self.num_replicas  # a replica counts as drained only after it had work
        self.training = False
        self.stats = SpotStats()
        self._last_time: float | None = None
        self._last_idle = 0

    def observe(self, in_flight: Sequence[int], now: float) -> str | None:
        if len(in_flight) != self.num_replicas:
            raise ValueError(f"expected {self.num_replicas} in-flight counts, got {len(in_flight)}")
        self._account(now)
        for replica, count in enumerate(in_flight):
            self.served[replica] |= count > 0
        busy = sum(count > 0 for count in in_flight)
        idle = sum(served and count == 0 for served, count in zip(self.served, in_flight, strict=True))
        self._last_idle = idle if busy else 0
        if self.training and busy == 0 and any(self.served):
            self.training = False
            return "stop"
        if not self.training and busy > 0 and idle >= self.min_idle_replicas:
            self.training = True
            self.stats.num_starts += 1
            return "start"
        return None

    def _account(self, now: float) -> None:
        if self._last_time is not None:
            elapsed = max(now - self._last_time, 0.0)
            self.stats.idle_replica_seconds += self._last_idle * elapsed
            if self.training:
                self.stats.trained_replica_seconds += self._last_idle * elapsed
                self.stats.training_seconds += elapsed
        self._last_time = now
