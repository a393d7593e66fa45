"""Spot training: the drafter trains in the background while a replica is idle and stops on demand.

This is what a drafter worker runs (on CPU a Ray actor wraps it; see the TLT trainer integration). `start()`
launches training in a thread; `stop()` returns within one optimizer step, bumps the weight version if any step
ran, and starts an asynchronous checkpoint. `request_stop()` only tells the burst to stop and returns at once (a
CPU worker's burst then ends its step in progress at idle priority, and a later `stop()` collects it). A failure
inside training (an exception, or a non-finite loss) never propagates: it is logged and recorded, the weights are
restored to the last good version, and the worker stays
usable, so a broken drafter cannot stop the RL run. With a memory budget (`drafter.memory_budget`), a burst also
ends at the step where the process holds more than its budget, or at an out-of-memory error; the trainer then frees
what it can, its oldest samples included, and starts no burst until it is back under.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

import torch

from verl_tlt.config import DrafterConfig
from verl_tlt.drafter.data import DrafterDataBuffer, DrafterSample
from verl_tlt.drafter.family import DrafterModel, feature_tokens
from verl_tlt.drafter.memory_budget import MemoryBudget, free_caches, is_out_of_memory
from verl_tlt.drafter.trainer import DrafterTrainer, TrainReport
from verl_tlt.modeling.torch_threads import with_torch_threads

logger = logging.getLogger(__name__)


class SpotTrainer:
    def __init__(
        self,
        model: DrafterModel,
        config: DrafterConfig | None = None,
        *,
        seed: int = 0,
        checkpoint_dir: str | Path | None = None,
        memory: MemoryBudget | None = None,
        device: torch.device | str | None = None,
    ):
        """config: the training recipe and the data buffer's size (`buffer_tokens`); seed: the trainer's;
        memory: the most this process may hold while it trains (None: no limit); device: where bursts train (None:
        where `model` is). The model lives where it was given between bursts (host memory): each burst moves the
        drafter, its optimizer and the target parts it shares onto `device` first and back when it ends, then frees
        the device's cache."""
        config = config or DrafterConfig()
        self.memory = memory
        self.host = model.fc.weight.device
        self.device = torch.device(device) if device is not None else self.host
        self.last_offload: dict[str, float] = {}  # seconds of the last burst's onload and offload
        self.memory_stops = 0  # bursts ended, or not started, over the memory budget or out of memory
        # The buffer's budget is memory: an EAGLE-3 sample keeps n layers per token (`feature_tokens`).
        tokens = feature_tokens(config.buffer_tokens, model.family, len(model.aux_layers), labelled=True)
        self.trainer = DrafterTrainer(model, DrafterDataBuffer(tokens), config, seed=seed)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.version = 0
        self.total_steps = 0
        self.last_report: TrainReport | None = None
        self.last_error: str | None = None
        self._good_state = self._snapshot()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._result: dict = {}
        self._burst_began = (0.0, 0)  # (time.monotonic(), trainer.global_step) when the last burst started

    @property
    def stop_event(self) -> threading.Event:
        """Set while a burst is being stopped (work between its steps checks it)."""
        return self._stop

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def add_samples(self, samples: Iterable[DrafterSample], hold: Collection[int] = ()) -> int:
        """Label and add captured samples (those at positions `hold` kept out of training until the buffer releases
        them); safe while training runs (the buffer locks itself, and a grown draft vocabulary waits for the next
        optimizer step)."""
        return self.trainer.add_samples(list(samples), hold)

    def start(
        self, max_steps: int | None = None, between_steps: Callable[[], None] | None = None, min_steps: int = 0
    ) -> bool:
        """Begin background training; False if it is already running or there is nothing to train on.

        between_steps(): called in the burst's thread after every optimizer step (the worker scores a group of
        samples there); it should take about a step's time. An exception in it is logged, and it is not called
        again in this burst, which trains on.
        min_steps: optimizer steps taken before a stop is heeded (0: a stop before the first step ends the burst
        at once, which the rollout's end prefers: on a real model one step takes seconds)."""
        if self.is_running:
            return False
        if len(self.trainer.buffer) == 0:
            return False
        if self.memory is not None and self.memory.exceeded():
            self._relieve_memory()
            if self.memory.exceeded():
                self.memory_stops += 1
                logger.warning("Drafter spot training not started: %s", self.memory.describe())
                return False
        self._stop.clear()
        self._result = {}
        self._burst_began = (time.monotonic(), self.trainer.global_step)
        # Train with the intra-op thread count the caller set, not the process default (see engine.torch_threads).
        train = with_torch_threads(self._train)
        self._thread = threading.Thread(
            target=train, args=(max_steps, between_steps, min_steps), name="drafter-spot-train", daemon=True
        )
        self._thread.start()
        return True

    def stop(self, timeout: float | None = None) -> TrainReport | None:
        """Preempt training (returns within one optimizer step), publish a new version if weights changed."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning(
                "Drafter spot training did not stop within %s s; it will stop after its current step", timeout
            )
            return None
        self._thread = None
        return self._finish()

    def request_stop(self) -> bool:
        """Tell a running burst to stop at its next check (before a step, or within a score), without waiting;
        whether it is still running then (`stop()` collects it and publishes what it trained)."""
        if self._thread is None:
            return False
        self._stop.set()
        return self._thread.is_alive()

    def burst_progress(self) -> tuple[int, float]:
        """(optimizer steps, seconds) of the last burst so far: live while it runs."""
        began, first_step = self._burst_began
        if self._thread is None:
            return 0, 0.0
        return self.trainer.global_step - first_step, time.monotonic() - began

    def adopt(self, version: int, total_steps: int) -> None:
        """Take the model's current weights as good version `version` (after loading another worker's state)."""
        if self.is_running:
            raise RuntimeError("Cannot adopt a drafter state while spot training runs; stop() first")
        self.version, self.total_steps = version, total_steps
        self._good_state = self._snapshot()
        self.last_error = None

    def weights(self) -> dict[str, torch.Tensor]:
        """CPU copy of the last good (published) drafter weights."""
        return {name: tensor.clone() for name, tensor in self._good_state.items()}

    def status(self) -> dict:
        report = self.last_report
        return {
            "running": self.is_running,
            "version": self.version,
            "total_steps": self.total_steps,
            "global_step": self.trainer.global_step,  # live: counts a running burst's steps as they happen
            "buffer_samples": len(self.trainer.buffer),
            "buffer_tokens": self.trainer.buffer.num_tokens,
            "last_error": self.last_error,
            "last_steps": report.steps if report else 0,
            "last_seconds": report.seconds if report else 0.0,
            "last_metrics": dict(report.last_metrics) if report else {},
            "draft_vocab_size": len(vocab) if (vocab := self.trainer.model.draft_vocab) is not None else 0,
            "draft_vocab_miss": self.trainer.last_draft_vocab_miss,
            "memory_stops": self.memory_stops,
            "resident_gib": self.memory.resident() / 2**30 if self.memory is not None else None,
            "device": str(self.device),
            **self.last_offload,
        }

    # ----- internals -----------------------------------------------------------------------------------------

    def _train(
        self, max_steps: int | None, between_steps: Callable[[], None] | None = None, min_steps: int = 0
    ) -> None:
        stop = _StopOrOverBudget(self._stop, self.memory)
        timings: dict[str, float] = {}
        try:
            begin = time.monotonic()
            self.trainer.to_device(self.device)  # onload (a no-op on the host)
            timings["onload_s"] = time.monotonic() - begin
            report = self.trainer.train(
                stop=stop, max_steps=max_steps, between_steps=_guarded(between_steps), min_steps=min_steps
            )
            self._result = {"report": report, "over_budget": stop.over_budget}
        except Exception as error:  # a failing drafter must never kill the RL run
            out_of_memory = is_out_of_memory(error)
            if out_of_memory:
                logger.warning("Drafter spot training ran out of memory on %s (%s); the burst ends", self.device, error)
            else:
                logger.exception("Drafter spot training failed; keeping drafter version %d", self.version)
            self._result = {"error": f"{type(error).__name__}: {error}", "over_budget": out_of_memory}
        finally:
            # Offload in this thread, so a stop waits for it and nothing runs on the device after the burst.
            begin = time.monotonic()
            self._offload()
            timings["offload_s"] = time.monotonic() - begin
            self.last_offload = timings

    def _offload(self) -> None:
        """Everything back to host memory and the device's cache freed, whatever state the burst ended in."""
        try:
            self.trainer.to_device(self.host)
        except Exception:  # a device that failed mid-move: state_dict copies below still restore the weights
            logger.exception("Drafter offload to %s failed", self.host)
        if self.device != self.host:
            free_caches()

    def _relieve_memory(self) -> None:
        """Free caches, then the oldest quarter of the buffered samples at a time, until under the budget."""
        free_caches()
        buffer = self.trainer.buffer
        while self.memory is not None and self.memory.exceeded() and len(buffer) > 0:
            dropped = buffer.drop_oldest(0.25)
            free_caches()
            logger.warning(
                "Drafter worker over its memory budget: dropped %d oldest samples (%s)", dropped, self.memory.describe()
            )

    def _finish(self) -> TrainReport | None:
        report = self._result.get("report")
        error = self._result.get("error")
        if self._result.get("over_budget"):
            self.memory_stops += 1
            if self.memory is not None:
                logger.warning("Drafter spot training stopped over its memory budget (%s)", self.memory.describe())
            self._relieve_memory()
        if error is None and report is not None and not self._weights_finite():
            error = f"non-finite drafter weights (last loss {report.last_metrics.get('loss')})"
            logger.error("Drafter spot training diverged (%s); keeping drafter version %d", error, self.version)
        if error is not None:
            self.last_error = error
            self.trainer.model.load_state_dict(self._good_state)
            # The optimizer's moments come from the failed burst too (possibly NaN): start them afresh.
            self.trainer.optimizer.state.clear()
            return report
        self.last_report = report
        if report is not None and report.steps > 0:
            self.total_steps += report.steps
            self.version += 1
            self._good_state = self._snapshot()
            self.last_error = None
            if self.checkpoint_dir is not None:
                # Samples stay out: every drafter worker holds the same buffer, and it refills from each step.
                self.trainer.save_checkpoint(self.checkpoint_dir / "latest", include_samples=False)
        return report

    def _weights_finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.trainer.model.parameters())

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.trainer.model.state_dict().items()}


def _guarded(work: Callable[[], None] | None) -> Callable[[], None] | None:
    """`work`, which after its first exception (logged) does nothing for the rest of the burst: a failing score must
    not cost the burst its training, let alone the RL run."""
    if work is None:
        return None
    failed = False

    def run() -> None:
        nonlocal failed
        if failed:
            return
        try:
            work()
        except Exception:
            failed = True
            logger.exception("Drafter work between the burst's steps failed; the burst trains on without it")

    return run


class _StopOrOverBudget:
    """What the trainer's loop asks before every optimizer step: told to stop, or over the memory budget (which
    it remembers, so the burst's end is counted as the budget's)."""

    def __init__(self, stop: threading.Event, memory: MemoryBudget | None):
        self.stop, self.memory, self.over_budget = stop, memory, False

    def is_set(self) -> bool:
        if self.stop.is_set():
            return True
        if self.memory is not None and self.memory.exceeded():
            self.over_budget = True
            return True
        return False
