"""The TLT coordinator: during each rollout, spot-train the drafter on replicas that have drained.

A thread polls every replica's in-flight request count; `SpotSchedule` turns the counts into "start" (a replica
drained while others still generate) and "stop" (every replica drained: the rollout is over). Stopping happens
as soon as the last response finishes, not when verl's replay buffer next polls, so training never holds the
rollout phase up by more than the optimizer step in progress (on CPU by at most `DrafterPool`'s STOP_WAIT_S of
it: `stop_in_background`). `finish()` (the trainer's on_sample_end) stops the
thread, preempts a burst that is still running and returns the step's `tlt/spot/*` and `tlt/drafter/*` metrics.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from verl_tlt.drafter.spot_schedule import SpotSchedule

logger = logging.getLogger(__name__)
# Like verl's own modules: INFO unless VERL_LOGGING_LEVEL says otherwise, so TLT's progress shows in the run log.
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))


class SpotCoordinator:
    def __init__(
        self,
        in_flight: Callable[[], Sequence[int]],
        pool,
        schedule: SpotSchedule,
        poll_interval_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        prepare: Callable[[int], object] | None = None,
    ):
        """prepare(rank): called before a burst starts on the drained replica `rank` (frees its engine's memory)."""
        self.in_flight, self.pool, self.schedule = in_flight, pool, schedule
        self.prepare = prepare
        self.poll_interval_s, self.clock, self.wall_clock = poll_interval_s, clock, wall_clock
        # Wall-clock time the last burst of this rollout had stopped (compared with the replicas' last finish).
        self.stopped_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bursts: list[dict] = []
        self._stop_seconds: list[float] = []
        self._cannot_start = False
        self.poll_errors = 0

    @property
    def watching(self) -> bool:
        return self._thread is not None

    def begin(self) -> None:
        """Start watching a rollout (call after its requests were submitted)."""
        if self._thread is not None:
            raise RuntimeError("SpotCoordinator.begin() called twice without finish()")
        self.schedule.reset()
        self._bursts, self._stop_seconds = [], []
        self._cannot_start = False
        self.stopped_at = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="tlt-spot-coordinator", daemon=True)
        self._thread.start()

    def finish(self) -> dict[str, float]:
        """Stop watching; preempt training if it still runs; this rollout's metrics."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.schedule.training:
            self.schedule.training = False
            self._stop_training()
        return self._metrics()

    # ----- internals -------------------------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # the coordinator must never break the rollout
                self.poll_errors += 1
                logger.exception("TLT coordinator poll failed")
            self._stop.wait(self.poll_interval_s)

    def tick(self) -> None:
        counts = list(self.in_flight())
        decision = self.schedule.observe(counts, self.clock())
        if decision == "start":
            if self._cannot_start:
                self._undo_start()
                return
            idle = [
                r for r, (served, n) in enumerate(zip(self.schedule.served, counts, strict=True)) if served and not n
            ]
            rank = self.pool.start(idle, self.prepare) if self.pool.available else None
            if rank is None and self.pool.available and self.pool.waiting_on_calls(idle):
                # The worker still stores the last step's captures or the policy's weights (on CPU it runs at idle
                # priority, so it catches up once the replica drains): ask again at the next poll.
                self._undo_start()
            elif rank is None:
                # Nothing to train on (empty buffer, first step) or no live worker: the idle time stays unused, and
                # this rollout does not ask again.
                self._cannot_start = True
                self._undo_start()
        elif decision == "stop":
            self._stop_training()

    def _undo_start(self) -> None:
        self.schedule.training = False
        self.schedule.stats.num_starts -= 1

    def _stop_training(self) -> None:
        begin = self.clock()
        status = self.pool.stop()
        self._stop_seconds.append(self.clock() - begin)
        self.stopped_at = self.wall_clock()
        if status is not None:
            self._bursts.append(status)

    def _metrics(self) -> dict[str, float]:
        stats = self.schedule.stats
        steps = sum(b.get("burst_steps", 0) for b in self._bursts)
        metrics = {
            "tlt/spot/idle_replica_s": stats.idle_replica_seconds,
            "tlt/spot/trained_replica_s": stats.trained_replica_seconds,
            "tlt/spot/idle_share_used": stats.idle_share_used,
            "tlt/spot/training_s": stats.training_seconds,
            "tlt/spot/starts": float(stats.num_starts),
            "tlt/spot/stop_latency_s": max(self._stop_seconds, default=0.0),
            # Bursts whose step in progress outlasted the stop's wait and ends in the background (CPU workers): their
            # last step is in the next step's tlt/drafter/total_steps, not in this one's burst_steps.
            "tlt/spot/stops_in_background": float(sum(bool(b.get("finishing")) for b in self._bursts)),
            "tlt/spot/poll_errors": float(self.poll_errors),
            "tlt/drafter/burst_steps": float(steps),
        }
        # Moving the drafter and its optimizer onto the training device and back (0 where it trains on the host).
        for key in ("onload_s", "offload_s"):
            if any(key in burst for burst in self._bursts):
                metrics[f"tlt/spot/{key}"] = max(burst.get(key, 0.0) for burst in self._bursts)
        if steps:
            metrics["tlt/drafter/step_s"] = sum(b.get("burst_seconds", 0.0) for b in self._bursts) / steps
        # The scores a burst took before training: of the newest captures the drafter had not trained on (eval_step
        # says whose), reported with the step whose rollout the burst ran in.
        scored = [burst["scores"] for burst in self._bursts if burst.get("scores")]
        if scored:
            metrics.update({f"tlt/drafter/eval_{key}": float(value) for key, value in scored[-1].items()})
        return metrics
