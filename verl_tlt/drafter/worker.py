"""A drafter worker: the spot trainer of one rollout replica's resources, driven by the TLT coordinator.

The TLT trainer runs one worker per rollout replica (on CPU a Ray actor beside the replica's server, pinned to its
cores). All workers hold the same data buffer (every captured sample is sent to each of them, in the same order, by
`receive`), but only one holds the authoritative drafter at a time: the last one that trained. When another
replica drains first, the
coordinator hands the training state (weights, optimizer, step counters, buffer cursor; not the samples, which the
new worker already has) from the owner to that worker before it starts, so there is one drafter history, never a
diverging copy per replica. A held-out part of each step's captures is scored (`tlt/drafter/eval_*`) by the next
bursts, a group between their optimizer steps, before the drafter trains on it: on the drained replica's
resources, so nothing of the drafter's runs while the RL step waits.

Nothing here imports Ray or verl; the integration wraps this class with `ray.remote`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from verl_tlt.config import DrafterConfig
from verl_tlt.cpu_affinity import pin_process, use_idle_class
from verl_tlt.drafter.data import DrafterSample
from verl_tlt.drafter.evaluate import ScoreRun, evaluate_within, evaluation_indices, subsample_for_evaluation
from verl_tlt.drafter.memory_budget import MemoryBudget, budget_bytes
from verl_tlt.drafter.spot import SpotTrainer

logger = logging.getLogger(__name__)

# Test-only fault injection, comma-separated: "exit_on_start=N" makes the N-th start() of every worker end its process,
# as the kernel's out-of-memory kill would (the drafter-crash test); "oom_on_start=N" makes that burst's first step
# raise the device's out-of-memory error, which ends the burst inside a live worker; "hold_score=N:PATH" keeps the
# score of RL step N's captures running until PATH exists, the burst is told to stop, or HOLD_LIMIT_S pass, as a slow
# host would: a burst stuck in its score must still stop when the rollout ends; "min_burst_steps=N" makes every burst
# take N optimizer steps before it heeds a stop, as a stop that arrives late would (the e2e tests: whether the
# drafter trained in a short run then does not depend on how long the toy's tail lasted).
FAULT_ENV = "VERL_TLT_DRAFTER_FAULT"
HOLD_LIMIT_S = 600.0


def _target_model(target_path: str, dtype: torch.dtype):
    """The target's parts the drafter uses (embedding, LM head, last layer for its start), not the whole model."""
    from verl_tlt.modeling.weights import load_drafter_parts

    return load_drafter_parts(target_path, dtype=dtype).requires_grad_(False)


class DrafterWorker:
    def __init__(
        self,
        target_path: str,
        config: DrafterConfig,
        *,
        rank: int = 0,
        num_threads: int | None = 1,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        fault: str | None = None,
        cpu_niceness: int = 0,
        checkpoint_dir: str | None = None,
        device: str = "cpu",
        cpu_cores: list[int] | None = None,
        idle_class: bool = False,
    ):
        """checkpoint_dir: where every training burst that changed the drafter is checkpointed, asynchronously
        (`<dir>/latest`); None = no per-burst checkpoints (verl's checkpoints still save the drafter). device: where
        bursts train (`integrations.control.placement`); scores, labels and checkpoints run in host memory.
        cpu_cores: pin this process to them (its replica's cores on CPU); None = where the OS places it. idle_class:
        run under the OS's idle scheduling class (`cpu_affinity.use_idle_class`; a CPU worker)."""
        self.cpu_cores = pin_process(cpu_cores) if cpu_cores else []
        self.idle_class = use_idle_class() if idle_class else False
        if num_threads:
            torch.set_num_threads(num_threads)
        if cpu_niceness > 0:
            # On CPU the "idle" core of a drained replica is shared with verl's own processes (agent loop,
            # reward, Ray): spot training should take only the cycles nobody else wants.
            os.nice(cpu_niceness)
        self.rank, self.config = rank, config
        self.target = _target_model(target_path, dtype)
        from verl_tlt.drafter.family import drafter_from_init, empty_like

        model = drafter_from_init(config.init, self.target, config.family, draft_vocab_size=config.draft_vocab_size)
        # The drafter as it started (frozen): fresh data is scored against it too, to show what training bought.
        self.frozen = empty_like(model).to(dtype=dtype)
        self.frozen.load_state_dict(model.state_dict())
        self.frozen.attach(self.target)
        self.frozen.requires_grad_(False)
        memory = MemoryBudget(budget_bytes(config.memory_budget_gib))
        self.spot = SpotTrainer(model, config, seed=seed, checkpoint_dir=checkpoint_dir, memory=memory, device=device)
        self._fault = fault if fault is not None else os.environ.get(FAULT_ENV, "")
        self._starts = 0
        self._to_score: tuple[int, list[DrafterSample]] | None = None  # (RL step, held samples) bursts score next
        self._score_run: ScoreRun | None = None  # its scoring, group by group, across bursts
        self._scored_step = -1  # the newest RL step whose captures a burst scored (moves with the training state)
        self._burst_scores: dict[str, float] | None = None
        self.scores_skipped = 0

    # ----- data and training -----------------------------------------------------------------------------------

    def add_samples(self, samples: Iterable[DrafterSample]) -> int:
        return self.spot.add_samples(samples)

    def receive(self, samples: list[DrafterSample]) -> int:
        """A step's fresh captures, stored now (cheap: the actor labelled them at capture). Up to `eval_max_pairs`
        response positions of them (whole samples, evenly spaced, at most half of the step's) are held out of
        training as the set the next bursts score the drafter on, between their optimizer steps, and join training
        once scored.

        Off the RL step's path: nothing is scored here. A set replaced before the bursts finished scoring it is
        released into training unscored and counted (`scores_skipped`). Returns how many samples were stored."""
        samples = list(samples)
        held: list[int] = []
        if self.config.eval_max_pairs > 0 and samples:
            self._drop_unscored()
            half = sum(sample.num_loss_pairs for sample in samples) // 2
            held = evaluation_indices(samples, min(self.config.eval_max_pairs, half))
            if len(held) == len(samples):  # a step too small to split (one sample): it trains, and is not scored
                held = []
            if held:
                self._to_score = (max(sample.step for sample in samples), [samples[i] for i in held])
        return self.spot.add_samples(samples, hold=held)

    def _drop_unscored(self) -> None:
        """The held set's scoring will not finish: its samples train unscored from now on."""
        if self._to_score is not None:
            if self._to_score[0] > self._scored_step:
                self.scores_skipped += 1
            self._to_score, self._score_run = None, None
            self.spot.trainer.buffer.release_held()

    def evaluate(self, samples: list[DrafterSample]) -> dict[str, float]:
        """Score the current drafter and the initial (frozen) one on samples neither has trained on.

        Keys: online_<metric> and frozen_<metric> for every metric of `evaluate_drafter`, on about
        `eval_max_pairs` response positions of `samples` (none when it is 0). Call it before add_samples, and not
        while training runs (it reads the weights being trained).
        """
        if self.spot.is_running:
            raise RuntimeError("DrafterWorker.evaluate while spot training runs; stop() first")
        return self._scores(samples)

    def _scores(self, samples: list[DrafterSample], stop: threading.Event | None = None) -> dict[str, float]:
        """`evaluate`'s scores, stopping early (over the groups scored so far) once `stop` is set."""
        self._maybe_hold_score(samples, stop)
        if self.config.eval_max_pairs == 0:
            return {}
        begin = time.monotonic()
        samples = subsample_for_evaluation(samples, self.config.eval_max_pairs)
        models = {"online": self.spot.trainer.model, "frozen": self.frozen}
        scores, scored = evaluate_within(
            models,
            samples,
            self.config.max_tokens_per_batch,
            self.config.eval_max_seconds,
            should_stop=None if stop is None else stop.is_set,
        )
        if scored < len(samples):
            logger.info(
                "Drafter scores on %d of %d samples: tlt.drafter.eval_max_seconds=%s ran out",
                scored,
                len(samples),
                self.config.eval_max_seconds,
            )
        flat = {f"{name}_{key}": value for name, found in scores.items() for key, value in found.items()}
        return {**flat, "samples": float(scored), "seconds": time.monotonic() - begin}

    def start(self) -> bool:
        """Begin spot training in the background; False when already running or the buffer is empty. Until the held
        captures (`receive`) are scored, the burst scores a group of them after each optimizer step (it trains first:
        a short idle window still moves the drafter)."""
        self._starts += 1
        self._maybe_crash()
        self._burst_scores = None
        min_steps = int(self._faults().get("min_burst_steps", 0))
        return self.spot.start(between_steps=self._score_between_steps, min_steps=min_steps)

    def stop(self) -> dict[str, Any]:
        """Preempt training (within one optimizer step, or one score group) and report what this burst did: with
        `scores` (`evaluate`'s keys and `step`, the RL step whose captures they score) if it scored."""
        begin = time.monotonic()
        report = self.spot.stop()
        self.frozen.to("cpu")  # a burst on an accelerator scored with it there
        status = self.status()
        status["stop_latency_s"] = time.monotonic() - begin
        status["burst_steps"] = report.steps if report is not None else 0
        status["burst_seconds"] = report.seconds if report is not None else 0.0
        if self._burst_scores:
            status["scores"] = self._burst_scores
        return status

    def request_stop(self) -> dict[str, Any]:
        """Tell the burst to stop and answer at once, without waiting for the optimizer step in progress: the status
        with what the burst did so far (`burst_steps`, `burst_seconds`, `scores`) and `finishing` (still running
        its last step). A `stop()` queued after this collects the burst and publishes it; the worker's calls queued
        behind that run once the burst has ended. For a CPU worker at idle priority (the pool waits a short while for
        that stop): on a real model one step takes seconds, which the rollout's end should not wait for."""
        begin = time.monotonic()
        finishing = self.spot.request_stop()
        steps, seconds = self.spot.burst_progress()
        status = self.status()
        status.update(
            stop_latency_s=time.monotonic() - begin, burst_steps=steps, burst_seconds=seconds, finishing=finishing
        )
        if self._burst_scores:
            status["scores"] = dict(self._burst_scores)
        return status

    def status(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "scores_skipped": self.scores_skipped,
            "cpu_cores": self.cpu_cores,
            "idle_class": self.idle_class,
            **self.spot.status(),
        }

    def _score_between_steps(self) -> None:
        """In the burst's thread, after each optimizer step: score the held set one group further (with the drafter
        as it is then), unless a burst (of any worker: the mark moves with the training state) has scored it. Once
        done, the set's scores are this burst's and its samples join training."""
        if self._to_score is None:
            return
        step, samples = self._to_score
        if step <= self._scored_step:
            self._to_score, self._score_run = None, None
            self.spot.trainer.buffer.release_held()
            return
        if self._score_run is None:
            self._maybe_hold_score(samples, self.spot.stop_event)
            if self.spot.stop_event.is_set():
                return
            # The frozen drafter's own layer where the burst trains (the shared target parts are there already).
            self.frozen.to(self.spot.trainer.device)
            models = {"online": self.spot.trainer.model, "frozen": self.frozen}
            budget = self.config.eval_max_seconds
            stop = self.spot.stop_event.is_set
            self._score_run = ScoreRun(models, samples, self.config.max_tokens_per_batch, budget, should_stop=stop)
        run = self._score_run
        run.step()  # interrupted by a stop: the group is scored afresh by the next burst
        if not run.finished:
            return
        scores, scored = run.result()
        flat = {f"{name}_{key}": value for name, found in scores.items() for key, value in found.items()}
        self._burst_scores = {**flat, "samples": float(scored), "seconds": run.seconds, "step": float(step)}
        self._scored_step = step
        self._to_score, self._score_run = None, None
        self.spot.trainer.buffer.release_held()

    # ----- the authoritative state -----------------------------------------------------------------------------

    def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, drafter weights) of the last good training burst."""
        return self.spot.version, self.spot.weights()

    def training_state(self) -> dict[str, Any]:
        """Everything another worker needs to continue this drafter's training (samples excluded)."""
        state = self.spot.trainer.state_dict(include_samples=False)
        return {
            **state,
            "version": self.spot.version,
            "total_steps": self.spot.total_steps,
            "scored_step": self._scored_step,
        }

    def load_training_state(self, state: dict[str, Any]) -> None:
        self.spot.trainer.load_state_dict(state)
        self.spot.adopt(state["version"], state["total_steps"])
        self._scored_step = max(self._scored_step, state.get("scored_step", -1))
        if self._to_score is not None and self._to_score[0] <= self._scored_step:  # scored by the last owner
            self._to_score, self._score_run = None, None
            self.spot.trainer.buffer.release_held()

    def load_weights(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Continue from published weights only (fresh optimizer): the fallback after the owner was lost."""
        self.spot.trainer.model.load_state_dict(weights)
        self.spot.trainer.optimizer.state.clear()  # moments of this worker's older weights do not fit these
        self.spot.adopt(version, self.spot.total_steps)

    def update_target_weights(self, named_tensors: dict[str, torch.Tensor]) -> int:
        """The policy's current embedding / LM head (shared with the drafter, frozen for it) after an RL update."""
        from verl_tlt.modeling.weights import load_weights

        return load_weights(self.target, named_tensors.items(), strict=False)

    # ----- checkpoints -----------------------------------------------------------------------------------------

    def save(self, directory: str) -> dict[str, int]:
        """Start an asynchronous, atomic checkpoint of the training state (buffer samples excluded); the version and
        optimizer steps of the state it holds (copied now, written in the background)."""
        if self.spot.is_running:
            raise RuntimeError("DrafterWorker.save while spot training runs; stop() first")
        self.spot.trainer.save_checkpoint(Path(directory), include_samples=False)
        return {"version": self.spot.version, "total_steps": self.spot.total_steps}

    def wait_for_save(self) -> bool:
        """Finish the checkpoint `save` started; False if it failed (logged; the previous checkpoint is kept)."""
        try:
            self.spot.trainer.wait_for_save()
        except RuntimeError as error:  # the save thread has logged the traceback
            logger.warning("%s; the worker keeps training from its state in memory", error)
            return False
        return True

    def load(self, directory: str, version: int, total_steps: int) -> None:
        self.spot.trainer.load_checkpoint(directory)
        self.spot.adopt(version, total_steps)

    def try_load(self, directory: str, version: int, total_steps: int) -> bool:
        """`load`, but a missing, corrupt or incompatible checkpoint is logged and leaves the worker as it was."""
        try:
            self.load(directory, version, total_steps)
        except (OSError, ValueError):
            logger.exception("Cannot resume the drafter from %s; this worker keeps its current drafter", directory)
            return False
        return True

    def ping(self) -> int:
        return self.rank

    def _faults(self) -> dict[str, str]:
        return dict(part.split("=", 1) for part in self._fault.split(",") if "=" in part)

    def _maybe_hold_score(self, samples: list[DrafterSample], stop: threading.Event | None = None) -> None:
        hold = self._faults().get("hold_score")
        if not hold:
            return
        step, path = hold.split(":", 1)
        if not any(sample.step == int(step) for sample in samples):
            return
        logger.warning("drafter worker %d: injected fault: step %s's score waits for %s", self.rank, step, path)
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not Path(path).exists() and time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            time.sleep(0.05)

    def _maybe_crash(self) -> None:
        faults = self._faults()
        if int(faults.get("exit_on_start", 0)) == self._starts:
            logger.error("drafter worker %d: injected fault %r, exiting", self.rank, self._fault)
            os._exit(1)
        if int(faults.get("oom_on_start", 0)) == self._starts:
            trainer = self.spot.trainer

            def out_of_memory(batch):
                del trainer.train_step  # once: the class's step again
                raise torch.OutOfMemoryError(f"out of memory (injected by {FAULT_ENV}={self._fault!r})")

            trainer.train_step = out_of_memory
