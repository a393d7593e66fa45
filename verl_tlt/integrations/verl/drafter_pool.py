"""The drafter workers of a TLT run (one Ray actor per rollout replica) and which of them owns the drafter.

Every worker holds the same data buffer (samples are broadcast); the owner is the worker that trained last and
holds the authoritative drafter. Starting training on another worker first hands the training state over, so the
drafter has one history. Nothing the pool asks of a worker between rollouts makes the RL step wait: samples and the
policy's weights are queued and collected later, and a worker scores and trains only in bursts. A worker that dies
or stops answering is dropped and logged (one still running a queued call is busy, not lost: `settle` carries its
calls over and nothing else queues behind them); if it was the owner, the
next worker continues from the last published weights (what the rollout replicas already run). With no workers
left, spot training is off for the rest of the run and the replicas keep their last drafter: the RL run never
fails because of the drafter. A verl checkpoint always carries the drafter: its save queues behind whatever the
owner is still doing and is waited for (bounded, with progress), never skipped because the owner is busy. On CPU
a stop waits at most STOP_WAIT_S for the optimizer step in progress (`stop_in_background`): a longer one the burst
ends at idle priority, and publishes at the next step's end.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

logger = logging.getLogger(__name__)
# Like verl's own modules: INFO unless VERL_LOGGING_LEVEL says otherwise, so TLT's progress shows in the run log.
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

# How long a call to a drafter worker may take before the worker is given up (a stop waits for one optimizer
# step; a hung worker must not hang the RL step).
CALL_TIMEOUT_S = 120.0
# How long a status or weights read waits for the owner's queued calls (storing samples, the policy's weights: well
# under a second each) before it answers with the last one it had.
QUIET_WAIT_S = 5.0
# With stop_in_background, how long a stop still waits for the burst's step in progress before leaving it to end in
# the background: a short step (the toy's, a GPU's) ends here as before, and its worker is free at once for what the
# step's end queues; a real model's CPU step (seconds) does not hold the rollout's end.
STOP_WAIT_S = 0.5
# How long a checkpoint waits for the owner to finish what was queued before it (samples, the policy's weights) and
# to write the drafter; verl's own save of the actor runs meanwhile.
SAVE_TIMEOUT_S = 600.0
SAVE_PROGRESS_S = 10.0


@dataclass(frozen=True)
class PendingSave:
    """A checkpoint queued on drafter worker `rank`: its save call, the call that waits for the write, and what the
    worker was still doing when the save was queued (None: nothing)."""

    rank: int
    save_call: Any
    done_call: Any
    behind: str | None


@dataclass(frozen=True)
class SaveFailed:
    """A checkpoint that could not even be queued, and why."""

    reason: str


@dataclass(frozen=True)
class SaveResult:
    """What a checkpoint of the drafter came to: `info` is the saved state's {"version", "total_steps"}."""

    saved: bool
    reason: str = ""
    rank: int | None = None
    info: dict | None = None
    waited_s: float = 0.0


class DrafterPool:
    def __init__(
        self,
        workers: list[Any],
        call_timeout_s: float = CALL_TIMEOUT_S,
        save_timeout_s: float = SAVE_TIMEOUT_S,
        *,
        stop_in_background: bool = False,
    ):
        """stop_in_background: the workers train on host CPU cores (at idle priority): `stop()` waits at most
        STOP_WAIT_S for the optimizer step in progress (seconds on a real model, which the rollout's end would wait
        for); a longer one the burst ends where it runs, and the worker is busy until then. Workers on an
        accelerator are waited for: the device's memory must be free before the actor trains."""
        if not workers:
            raise ValueError("DrafterPool needs at least one drafter worker")
        self.workers = list(workers)
        self.alive = [True] * len(workers)
        self.owner = 0
        self.training_on: int | None = None
        self.call_timeout_s = call_timeout_s
        self.failures = 0
        self.last_error: str | None = None
        self.published: tuple[int, dict] | None = None  # (version, weights) last read from the owner
        self.handoff_seconds = 0.0
        self.save_timeout_s = save_timeout_s
        self._saving: PendingSave | SaveFailed | None = None
        self._stopped_for_save: dict | None = None  # the report of a burst that a checkpoint preempted
        # (rank, call) not collected yet: deliver's, update_target_weights', a save that outlasted its wait
        self._pending: list[tuple[int, Any]] = []
        self._last_status: dict | None = None
        self.stop_in_background = stop_in_background
        self._finishing: set[Any] = set()  # the queued stop() calls of bursts told to stop in the background
        self._lock = threading.RLock()

    @property
    def available(self) -> bool:
        return any(self.alive)

    # ----- data ------------------------------------------------------------------------------------------------

    def deliver(self, samples: list) -> None:
        """Queue, without waiting: every live worker stores `samples` in the same order (`DrafterWorker.receive`,
        cheap) and keeps them as the set its next burst scores the drafter on. `settle()` collects the calls.

        Nothing here runs the drafter: scoring and training happen in bursts, on drained replicas during a rollout,
        so nothing of the drafter's competes with the actor update or makes the step's end wait.
        """
        if not samples:
            return
        with self._lock:
            ref = ray.put(samples)
            for rank, worker in self._live():
                self._pending.append((rank, worker.receive.remote(ref)))

    def settle(self) -> None:
        """Collect the queued calls that have finished, without waiting for the others: a worker still running one
        (a checkpoint's write) is busy, not lost, and no burst starts on it until its calls are done; one that
        died is dropped when its call is collected."""
        with self._lock:
            if not self._pending:
                return
            calls = [call for _, call in self._pending]
            ready, _ = ray.wait(calls, num_returns=len(calls), timeout=0)
            done = set(ready)
            finished = [(rank, call) for rank, call in self._pending if call in done]
            self._pending = [(rank, call) for rank, call in self._pending if call not in done]
            for rank, call in finished:
                result = self._get(rank, call)
                if call in self._finishing:  # a burst that ended in the background: its final report
                    self._finishing.discard(call)
                    if result is not None and rank == self.owner:
                        self._last_status = result

    def busy(self, rank: int) -> bool:
        """Whether calls queued on `rank` are still running: deliver's, update_target_weights', a checkpoint."""
        return not self._finished(rank, wait_s=0.0)

    def _quiet(self, rank: int) -> bool:
        """Whether `rank` has no queued call running, waiting up to QUIET_WAIT_S for them to finish (not at all for
        a burst still ending its step in the background: that can take seconds at idle priority)."""
        ending = any(r == rank and call in self._finishing for r, call in self._pending)
        return self._finished(rank, wait_s=0.0 if ending else QUIET_WAIT_S)

    def _finished(self, rank: int, wait_s: float) -> bool:
        """Whether every call queued on `rank` (a checkpoint's included) has finished, waiting up to `wait_s`."""
        calls = [call for r, call in self._pending if r == rank]
        if isinstance(self._saving, PendingSave) and self._saving.rank == rank:
            calls += [self._saving.save_call, self._saving.done_call]
        if not calls:
            return True
        ready, _ = ray.wait(calls, num_returns=len(calls), timeout=wait_s)
        return len(ready) == len(calls)

    def update_target_weights(self, named_tensors: dict) -> None:
        """Queue the policy's shared weights on every live worker, without waiting (a worker runs its calls in order,
        so its next burst trains against them); `settle()` collects the calls."""
        with self._lock:
            ref = ray.put(named_tensors)
            for rank, worker in self._live():
                self._pending.append((rank, worker.update_target_weights.remote(ref)))

    # ----- training --------------------------------------------------------------------------------------------

    def start(self, idle_replicas: list[int], prepare: Callable[[int], Any] | None = None) -> int | None:
        """Start spot training on the first live worker among `idle_replicas`; its rank, or None.

        prepare(rank): called once the worker is chosen, before it starts (the runtime frees the drained replica's
        KV cache there, for the burst to use)."""
        with self._lock:
            if self.training_on is not None:
                return None
            self.settle()
            for rank in idle_replicas:
                if not self.alive[rank] or self.busy(rank):
                    continue
                if rank != self.owner and self.alive[self.owner] and self.busy(self.owner):
                    continue  # the hand-over would queue behind the owner's unfinished calls
                if rank != self.owner and not self._hand_over(rank):
                    continue
                if prepare is not None:
                    prepare(rank)
                started = self._get(rank, self.workers[rank].start.remote())
                if started:
                    self.training_on = rank
                    return rank
                return None
            return None

    def waiting_on_calls(self, idle_replicas: list[int]) -> bool:
        """Whether a start on `idle_replicas` failed only because a live worker there (or the owner it would take the
        drafter from) still runs queued calls (a step's captures, the policy's weights, a checkpoint): a start at a
        later poll may succeed, unlike one refused for an empty buffer or a dead worker."""
        with self._lock:
            if self.training_on is not None:
                return False
            candidates = [rank for rank in idle_replicas if self.alive[rank]]
            if candidates and self.alive[self.owner]:
                candidates.append(self.owner)
            return any(self.busy(rank) for rank in candidates)

    def stop(self) -> dict | None:
        """Preempt the running burst (within one optimizer step; with `stop_in_background`, within STOP_WAIT_S: a
        longer step ends where it runs, after the caller has moved on); the worker's status, or None."""
        with self._lock:
            rank, self.training_on = self.training_on, None
            if rank is None:  # a checkpoint may have preempted the burst already: its report is the caller's
                status, self._stopped_for_save = self._stopped_for_save, None
                return status
            worker = self.workers[rank]
            status = self._get(rank, worker.request_stop.remote()) if self.stop_in_background else None
            if status is not None and status.get("finishing"):
                call = worker.stop.remote()
                ready, _ = ray.wait([call], timeout=STOP_WAIT_S)
                if ready:  # the step ended within the bound: its report, as a stop that waited gives
                    status = self._get(rank, call)
                else:
                    # Collected by settle() (the worker is busy until then, so nothing queues a start or a hand-over
                    # on it meanwhile); its calls queued later run after the burst has ended.
                    self._pending.append((rank, call))
                    self._finishing.add(call)
            elif self.alive[rank]:
                status = self._get(rank, worker.stop.remote())
            if status is not None:
                self.owner = rank
                self._last_status = status  # what status() gives while the worker runs calls queued after the stop
            return status

    def status(self) -> dict | None:
        """The owner's status; while it runs queued calls, the last one it gave (a call would queue behind them)."""
        with self._lock:
            if not self.alive[self.owner]:
                return None
            if not self._quiet(self.owner):
                return self._last_status
            self._last_status = self._get(self.owner, self.workers[self.owner].status.remote())
            return self._last_status

    def latest_weights(self) -> tuple[int, dict] | None:
        """(version, weights) of the owner's last good drafter; kept as the fallback if the owner dies."""
        with self._lock:
            if not self.alive[self.owner] or not self._quiet(self.owner):
                return self.published
            result = self._get(self.owner, self.workers[self.owner].weights.remote())
            if result is not None:
                self.published = result
            return self.published

    # ----- checkpoints -----------------------------------------------------------------------------------------

    def save(self, directory: str) -> None:
        """Queue the owner's checkpoint into `directory`, without waiting; `wait_for_save()` completes it.

        However busy the owner is, the drafter goes with verl's checkpoint: a burst still running is preempted first
        (within one optimizer step; its report waits for the coordinator's `stop`), and calls still running keep the
        save queued behind them (a worker runs its calls in order), which `wait_for_save` waits for.
        """
        with self._lock:
            if self.training_on is not None:
                self._stopped_for_save = self.stop()
            if not self.alive[self.owner]:
                self._saving = SaveFailed("no drafter worker is alive (every one failed earlier in the run)")
                return
            rank, worker = self.owner, self.workers[self.owner]
            behind = None
            if self.busy(rank):
                behind = "busy with its earlier calls"
                logger.info("TLT: drafter worker %d is still %s; the checkpoint is queued behind them", rank, behind)
            self._saving = PendingSave(rank, worker.save.remote(directory), worker.wait_for_save.remote(), behind)

    def wait_for_save(self, timeout_s: float | None = None) -> SaveResult:
        """Finish the checkpoint `save` queued: what was saved, or why nothing was.

        Waits at most `timeout_s` (default: the pool's `save_timeout_s`) with a log line every ~10 s. A worker still
        busy then is kept (busy is not dead): its calls stay queued and are collected later, and the save fails.
        """
        pending = self._saving
        if not isinstance(pending, PendingSave):
            self._saving = None
            return SaveResult(False, pending.reason if pending else "no drafter checkpoint was started")
        rank, limit = pending.rank, self.save_timeout_s if timeout_s is None else timeout_s
        begin = time.monotonic()
        finished = self._wait_logged(pending, limit)
        with self._lock:
            self._saving = None
            waited = time.monotonic() - begin
            if not finished:  # busy is not dead: the worker is kept, and a later settle collects these calls
                self._pending += [(rank, pending.save_call), (rank, pending.done_call)]
                doing = pending.behind or "writing the checkpoint"
                reason = f"drafter worker {rank} was still {doing} after {waited:.0f} s"
                return SaveResult(False, reason, rank, waited_s=waited)
            info = self._get(rank, pending.save_call)
            written = info is not None and self._get(rank, pending.done_call)
        if info is None:
            return SaveResult(False, f"drafter worker {rank} failed while saving ({self.last_error})", rank)
        if not written:
            return SaveResult(False, f"drafter worker {rank} could not write the checkpoint (its log says why)", rank)
        return SaveResult(True, "", rank, info, waited)

    def _wait_logged(self, pending: PendingSave, limit: float) -> bool:
        """Wait for a queued save to end (True) or `limit` to pass (False), saying what it waits for every ~10 s."""
        begin = time.monotonic()
        while True:
            waited = time.monotonic() - begin
            ready, _ = ray.wait([pending.done_call], timeout=max(0.0, min(SAVE_PROGRESS_S, limit - waited)))
            if ready:
                return True
            waited = time.monotonic() - begin
            if waited >= limit:
                return False
            logger.info(
                "TLT: the drafter checkpoint waits for drafter worker %d to finish %s (%.0f s so far, at most %.0f s)",
                pending.rank,
                pending.behind or "writing it",
                waited,
                limit,
            )

    def load(self, directory: str, version: int, total_steps: int) -> bool:
        """Every worker resumes from the checkpoint; True if the owner did (training continues from the owner's
        state: a worker that trains next receives it first).

        A checkpoint a worker cannot read leaves that worker with its drafter (the initial one, at resume) and alive.
        """
        with self._lock:
            calls = {rank: worker.try_load.remote(directory, version, total_steps) for rank, worker in self._live()}
            loaded = {rank: self._get(rank, call) for rank, call in calls.items()}
            return bool(loaded.get(self.owner))

    # ----- internals -------------------------------------------------------------------------------------------

    def _live(self) -> list[tuple[int, Any]]:
        return [(r, w) for r, w in enumerate(self.workers) if self.alive[r]]

    def _hand_over(self, rank: int) -> bool:
        begin = time.monotonic()
        if self.alive[self.owner]:
            state = self._get(self.owner, self.workers[self.owner].training_state.remote())
        else:
            state = None
        if state is not None:
            ok = self._get(rank, self.workers[rank].load_training_state.remote(state), ok=True)
        elif self.published is not None:  # the owner was lost: continue from what the replicas run
            version, weights = self.published
            ok = self._get(rank, self.workers[rank].load_weights.remote(version, weights), ok=True)
        else:
            ok = True  # nothing trained yet: every worker still holds the initial drafter
        self.handoff_seconds += time.monotonic() - begin
        if ok:
            self.owner = rank
        return bool(ok)

    def _get(self, rank: int, call, ok: bool = False):
        """ray.get with a timeout; a dead or hung worker is dropped (never raised). `ok`: return True on success."""
        try:
            result = ray.get(call, timeout=self.call_timeout_s)
            return True if ok else result
        except Exception as error:  # RayActorError, GetTimeoutError, an exception inside the worker
            self._lose(rank, error)
            return None

    def _lose(self, rank: int, error: BaseException) -> None:
        if not self.alive[rank]:
            return
        self.alive[rank] = False
        self.failures += 1
        self.last_error = f"drafter worker {rank}: {type(error).__name__}: {error}"
        if self.training_on == rank:
            self.training_on = None
        fallback = (
            f"drafter version {self.published[0]} (last published) stays in the rollout replicas"
            if self.published is not None
            else "the replicas keep their current drafter"
        )
        logger.error(
            "TLT drafter worker %d failed (%s); dropping it, %d left. The RL run continues: %s.",
            rank,
            self.last_error,
            sum(self.alive),
            fallback,
        )
        try:
            ray.kill(self.workers[rank])
        except Exception:
            pass
        if rank == self.owner:
            live = [r for r, _ in self._live()]
            if live:
                self.owner = live[0]
                if self.published is not None:
                    version, weights = self.published
                    self._get(self.owner, self.workers[self.owner].load_weights.remote(version, weights), ok=True)
