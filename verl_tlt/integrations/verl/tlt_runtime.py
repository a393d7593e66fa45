"""Everything TLT adds to one verl training run, called from the TLT trainer's hooks.

Per RL step (sync trainer, TLT on):
1. `on_sample_begin`: the coordinator starts watching the replicas (spot training on drained ones).
2. `on_sample_end`: training is preempted, verl sleeps the replicas, and each replica's rollout record (finish
   times, SD counters) becomes the `tlt/tail/*` and `tlt/sd/*` metrics.
3. Around the actor's log-prob pass: hidden states of the longest responses are captured and broadcast to the
   drafter workers' buffers.
4. `on_step_end` (after verl's actor -> rollout weight sync): the drafter workers get the policy's new embedding
   and LM head, and every `tlt.drafter.sync_every` steps the newest drafter goes to every replica (versioned).
5. Checkpoints: the owner's drafter training state is saved next to verl's and restored on resume.
6. `on_validate_end`: what validation generated is closed as a validation record and its SD counters dropped, so
   the next step's metrics cover that step's training rollout only.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from verl_tlt.config import TLTConfig
from verl_tlt.drafter.capture import CaptureWindows
from verl_tlt.drafter.capture_record import RecordedStep, save_step
from verl_tlt.drafter.family import feature_layers_for, feature_tokens
from verl_tlt.drafter.spot_schedule import SpotSchedule
from verl_tlt.drafter.worker import FAULT_ENV, DrafterWorker
from verl_tlt.files import write_json
from verl_tlt.integrations.control.contract import check_rollout_servers
from verl_tlt.integrations.control.placement import place_worker
from verl_tlt.integrations.torch_rollout.options import torch_rollout_config
from verl_tlt.integrations.verl.checkpoint_paths import checkpoint_root, resumed_folder, step_folder
from verl_tlt.integrations.verl.coordinator import SpotCoordinator
from verl_tlt.integrations.verl.drafter_pool import DrafterPool
from verl_tlt.metrics.rollout_metrics import rollout_metrics
from verl_tlt.request_seeds import rollout_seed

logger = logging.getLogger(__name__)
# Like verl's own modules: INFO unless VERL_LOGGING_LEVEL says otherwise, so TLT's progress shows in the run log.
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

# Loading a drafter into a replica is a state-dict copy; a replica that takes longer than this is treated as failed.
DRAFTER_SYNC_TIMEOUT_S = 300.0
# Freeing or restoring a drained replica's KV cache (a sleep and a wake-up at most): the coordinator's thread waits
# for it, and must not hold the rollout's end for long if a replica hangs.
KV_LENDING_TIMEOUT_S = 30.0

CHECKPOINT_DIR = "tlt_drafter"
SPOT_CHECKPOINT_DIR = "tlt_spot"
META_FILE = "meta.json"


class TLTRuntime:
    """TLT's side of one run; the trainer calls the same hooks on ``trainer_mode.DisabledTLT`` when TLT is off."""

    def __init__(self, config: Any, tlt: TLTConfig):
        self.config, self.tlt = config, tlt
        self.metrics: dict[str, float] = {}
        self.servers: list[Any] = []
        self.pool: DrafterPool | None = None
        self.coordinator: SpotCoordinator | None = None
        self.pushed_version: int | None = None
        self._pending_save: tuple[Path, int] | None = None  # (drafter folder, step) of a checkpoint being written
        self._checkpoint_failures = 0
        self._spot_watched = False  # whether the coordinator watches the current rollout
        # The drafter workers build their target (embedding, LM head) from model.path; after a resume that is not
        # the policy, so the first capture pushes the replicas' weights before the drafters are scored.
        self._worker_targets_stale = False
        self.resume_dir: Path | None = None
        self._feature_layers: tuple[int, ...] = ()  # target layers captured besides the final one (EAGLE-3's)
        self._drain_calls: list[Any] = []
        self._freed: set[int] = set()  # replicas that freed their engine's memory for a burst this rollout
        # For tlt.drafter.record_dir: the step being captured, and the policy's shared weights that its rollout
        # used (None until the first push: the initial target's).
        self._capture_step = 0
        self._rollout_shared: dict | None = None

    # ----- set-up ----------------------------------------------------------------------------------------------

    def prepare_workers(self, role_worker_mapping: dict) -> None:
        """Swap verl's hard-coded actor worker for the one with TLT's hidden-state capture."""
        from verl.trainer.ppo.utils import Role

        from verl_tlt.integrations.verl.capture_worker import TLTActorRolloutRefWorker

        for role in (Role.ActorRolloutRef, Role.ActorRollout, Role.Actor):
            if role in role_worker_mapping:
                role_worker_mapping[role] = ray.remote(TLTActorRolloutRefWorker)
                return
        raise RuntimeError(f"TLT: no actor role among verl's workers {list(role_worker_mapping)}")

    def on_checkpoint_loaded(self, global_steps: int) -> None:
        """After verl's `_load_checkpoint`: a resumed run (step > 0) restores the drafter saved with that step."""
        if global_steps > 0:
            self.resume_dir = resumed_folder(self.config, global_steps)

    def on_init_end(self, trainer: Any) -> None:
        """Once verl's trainer has its rollout replicas and actor workers: start TLT on them."""
        from verl.utils.fs import copy_to_local

        target = copy_to_local(self.config.actor_rollout_ref.model.path)
        self.setup(trainer.llm_server_manager.get_replicas(), trainer.actor_rollout_wg, target)

    def setup(self, replicas: list[Any], actor_wg: Any, target_path: str) -> None:
        self.servers = [replica.servers[0] for replica in replicas]
        check_rollout_servers(self.servers)  # the torch server and TLT's vLLM server implement RolloutControl
        installed = actor_wg.tlt_install_capture()
        if not any(installed):
            raise RuntimeError("TLT could not hook the actor's forward for hidden-state capture (no actor worker)")
        self.actor_wg = actor_wg
        if self.tlt.drafter.family == "eagle3":
            self._feature_layers = _feature_layers(self.tlt.drafter, target_path)
        replicas_count, min_idle = len(self.servers), self.tlt.drafter.min_idle_replicas
        if self.tlt.drafter.train and 1 < replicas_count <= min_idle:
            raise ValueError(
                f"tlt.drafter.min_idle_replicas={min_idle} with {replicas_count} rollout replicas: spot training "
                "starts when that many replicas have drained while another still generates, which can never happen; "
                f"set tlt.drafter.min_idle_replicas <= {replicas_count - 1}"
            )
        workers = self._make_workers(target_path)
        # Bursts on host CPU cores end a long step in progress at idle priority, after the rollout has moved on.
        self.pool = DrafterPool(workers, stop_in_background=self._worker_devices == {"cpu"})
        schedule = SpotSchedule(replicas_count, min(min_idle, replicas_count))
        self.coordinator = SpotCoordinator(
            self._in_flight,
            self.pool,
            schedule,
            poll_interval_s=self.tlt.drafter.poll_interval_s,
            prepare=self._free_replica,
        )
        if self.resume_dir is not None:
            self._restore(self.resume_dir)
            self._worker_targets_stale = True
        self.push_drafter(force=True)
        if len(self.servers) < 2 and self.tlt.drafter.train:
            logger.warning(
                "TLT: one rollout replica, so no replica ever drains while another generates: the drafter is not "
                "spot-trained. Run two or more replicas (e.g. trainer.n_gpus_per_node=2) to train it online."
            )

    def _make_workers(self, target_path: str) -> list[Any]:
        threads = torch_rollout_config(self.config.actor_rollout_ref.rollout).num_threads
        fault = os.environ.get(FAULT_ENV, "")
        seed = rollout_seed(self.config.actor_rollout_ref.rollout)
        workers = []
        self._worker_devices: set[str] = set()  # where the workers train: "cpu" or an accelerator
        for rank, server in enumerate(self.servers):
            node = ray.get(server.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))
            # On the replica's node, on its GPU where it has one (control.placement: verl's own way of reaching a
            # GPU its placement group holds); the actor asks Ray for no resources either way.
            placement = place_worker(self.tlt.drafter.device, ray.get(server.accelerator_ids.remote()), rank)
            # On CPU, the replica's own cores (placement.replica_cpu_cores): a burst never takes a decoding core.
            self._worker_devices.add(placement.device)
            cores = ray.get(server.cpu_cores.remote()) if placement.device == "cpu" else []
            logger.info(
                "TLT drafter worker %d trains on %s%s",
                rank,
                placement.describe(),
                f", pinned to its replica's cores {cores}" if cores else "",
            )
            options: dict = {}
            if placement.env_vars:
                options["runtime_env"] = {"env_vars": placement.env_vars}
            worker = (
                ray.remote(DrafterWorker)
                .options(
                    num_cpus=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
                    **options,
                )
                .remote(
                    target_path,
                    self.tlt.drafter,
                    rank=rank,
                    num_threads=threads,
                    seed=seed,
                    fault=fault,
                    cpu_niceness=self.tlt.drafter.cpu_niceness,
                    checkpoint_dir=str(self._spot_checkpoint_root() / f"worker_{rank}"),
                    device=placement.device,
                    cpu_cores=cores or None,
                    idle_class=self.tlt.drafter.cpu_idle_class and placement.device == "cpu",
                )
            )
            workers.append(worker)
        ray.get([w.ping.remote() for w in workers])
        return workers

    def _spot_checkpoint_root(self) -> Path:
        """`<trainer.default_local_dir>/tlt_spot`: each worker's latest burst, written asynchronously."""
        return checkpoint_root(self.config) / SPOT_CHECKPOINT_DIR

    def _in_flight(self) -> list[int]:
        """0 for replicas that reported draining (see TorchRolloutServer.wait_for_drain), 1 for the others.

        A local check of the outstanding drain calls: no RPC to the (busy) replicas per poll.
        """
        ready, _ = ray.wait(self._drain_calls, num_returns=len(self._drain_calls), timeout=0)
        done = set(ready)
        return [0 if call in done else 1 for call in self._drain_calls]

    # ----- rollout ---------------------------------------------------------------------------------------------

    @property
    def _training(self) -> bool:
        """Whether the drafter learns now: spot training is on and a drafter worker is alive."""
        return self.tlt.drafter.train and self.pool.available

    def on_sample_begin(self) -> None:
        self._spot_watched = self._training
        if self._spot_watched:
            self._drain_calls = [s.wait_for_drain.remote() for s in self.servers]
            self.coordinator.begin()

    def before_sleep(self) -> None:
        if self.coordinator.watching:
            self.metrics.update(self.coordinator.finish())  # the burst has stopped and left the device
        self._restore_replicas()

    def _free_replica(self, rank: int) -> None:
        """Before a burst on drained replica `rank`: its engine frees its KV cache (control: free_for_training).

        Failures are logged: the burst then trains in whatever memory is left (an out-of-memory ends it)."""
        try:
            if ray.get(self.servers[rank].free_for_training.remote(), timeout=KV_LENDING_TIMEOUT_S):
                self._freed.add(rank)
        except Exception as error:
            logger.warning("TLT: rollout replica %d could not free memory for the drafter (%s)", rank, error)

    def _restore_replicas(self) -> None:
        """Before verl sleeps the replicas: the ones that freed memory for a burst take it back."""
        freed, self._freed = sorted(self._freed), set()
        for rank in freed:
            try:
                ray.get(self.servers[rank].restore_after_training.remote(), timeout=KV_LENDING_TIMEOUT_S)
            except Exception as error:  # the server's own sleep and next request restore it too
                logger.warning("TLT: rollout replica %d could not restore its KV cache (%s)", rank, error)

    def after_sleep(self) -> None:
        records = ray.get([s.pop_last_rollout.remote() for s in self.servers])
        stats = ray.get([s.sd_stats.remote(True) for s in self.servers])
        # Only a rollout the coordinator watched has a training stop time (its stopped_at is from an earlier one).
        stopped_at = self.coordinator.stopped_at if self._spot_watched else None
        self._spot_watched = False
        self.metrics.update(rollout_metrics(records, stats, training_stopped_at=stopped_at))

    def after_validation(self) -> None:
        ray.get([s.end_validation.remote() for s in self.servers])

    # ----- capture ---------------------------------------------------------------------------------------------

    def arm_capture(self, step: int) -> None:
        self._capture_step = step
        if self._training:
            drafter = self.tlt.drafter
            windows = CaptureWindows(
                drafter.capture_window_tokens,
                drafter.capture_tail_weight,
                # The whole batch's: each replica speculates at or below the threshold.
                sd_batch=self.tlt.speculative.threshold * len(self.servers),
            )
            # The budget is memory: EAGLE-3's samples carry more than one vector per token (`feature_tokens`).
            layers = self._feature_layers
            tokens = feature_tokens(drafter.capture_tokens, drafter.family, len(layers), labelled=False)
            self.actor_wg.tlt_arm_capture(step, tokens, drafter.teacher_top_k, windows, layers)

    def collect_capture(self) -> None:
        if not self._training:
            return
        begin = time.perf_counter()
        results = self.actor_wg.tlt_pop_captured()
        samples = [s for rank_samples, _ in results for s in rank_samples]
        if self._worker_targets_stale:  # the rollout just used the policy's weights: the replicas hold them
            self._push_target_weights()
        # Every worker stores them (queued; nothing waits). The next burst, on a drained replica during the next
        # rollout, first scores the online and the initial drafter on them (the drift a frozen drafter would suffer,
        # measured on the same data) and reports it with the step it ends in (coordinator: tlt/drafter/eval_*).
        self.pool.deliver(samples)
        if self.tlt.drafter.record_dir:
            self._record(samples)
        stats = [rank_stats for _, rank_stats in results if rank_stats]
        self.metrics.update(
            {
                "tlt/capture/hook_s": max((s["seconds"] for s in stats), default=0.0),
                "tlt/capture/total_s": time.perf_counter() - begin,
                "tlt/capture/samples": float(len(samples)),
                "tlt/capture/tokens": float(sum(s.num_tokens for s in samples)),
            }
        )

    def _record(self, samples: list) -> None:
        """Save this step's captures for offline replay; a failed write is logged and never stops the run."""
        record = RecordedStep(self._capture_step, samples, self._rollout_shared)
        try:
            save_step(self.tlt.drafter.record_dir, record)
        except OSError as error:
            logger.warning(
                "TLT: cannot record step %d's captures in %s: %s", record.step, self.tlt.drafter.record_dir, error
            )

    # ----- after the actor's weight sync -----------------------------------------------------------------------

    def on_step_end(self, step: int) -> None:
        waited = time.perf_counter()
        self.pool.settle()  # collects what finished; never waits for a worker
        self.metrics["tlt/capture/settle_s"] = time.perf_counter() - waited
        status = self.pool.status() or {}
        if step % self.tlt.drafter.sync_every == 0:
            self.push_drafter(owner_version=status.get("version"))
        if self._training:  # queued behind the reads above: they need not wait for it
            self._push_target_weights()
        last = status.get("last_metrics") or {}
        self.metrics.update(
            {
                "tlt/drafter/version": float(self.pushed_version if self.pushed_version is not None else -1),
                "tlt/drafter/total_steps": float(status.get("total_steps", 0)),
                "tlt/drafter/buffer_tokens": float(status.get("buffer_tokens", 0)),
                "tlt/drafter/workers_alive": float(sum(self.pool.alive)),
                "tlt/drafter/worker_failures": float(self.pool.failures),
                "tlt/drafter/handoff_s": self.pool.handoff_seconds,
                "tlt/drafter/memory_stops": float(status.get("memory_stops", 0)),
                "tlt/drafter/eval_skipped": float(status.get("scores_skipped", 0)),
            }
        )
        if status.get("resident_gib") is not None:
            self.metrics["tlt/drafter/resident_gib"] = float(status["resident_gib"])
        self.pool.handoff_seconds = 0.0
        # The draft vocabulary's size, and the share of the newest captured response tokens outside it (as it was
        # before they arrived): how far the policy has drifted from the tokens the drafter can draft.
        if status.get("draft_vocab_size"):
            self.metrics["tlt/drafter/draft_vocab_size"] = float(status["draft_vocab_size"])
        if status.get("draft_vocab_miss") is not None:
            self.metrics["tlt/drafter/draft_vocab_miss"] = float(status["draft_vocab_miss"])
        for key in ("loss", "hidden_loss", "logit_loss", "top1_accuracy"):
            if key in last:
                self.metrics[f"tlt/drafter/{key}"] = float(last[key])

    def _push_target_weights(self) -> None:
        """The policy's embedding and LM head (shared with the drafter) from a replica to every drafter worker.

        A refresh that fails (the replica's export, a full /dev/shm or object store, a timeout) is logged and
        counted in tlt/drafter/target_refresh_failures, and retried at the next capture: until then the workers
        train against the previous policy's head, which slows the drafter's tracking, never the rollout.
        """
        try:
            shared = ray.get(self.servers[0].target_shared_weights.remote(), timeout=DRAFTER_SYNC_TIMEOUT_S)
            self.pool.update_target_weights(shared)
        except Exception as error:  # a drafter-side refresh must never fail the RL step
            self._worker_targets_stale = True
            self.metrics["tlt/drafter/target_refresh_failures"] = (
                self.metrics.get("tlt/drafter/target_refresh_failures", 0.0) + 1
            )
            logger.error(
                "TLT: refreshing the drafter workers' copy of the policy's embedding and LM head failed (%s: %s); "
                "they keep the previous one and the next step retries",
                type(error).__name__,
                error,
            )
            return
        self._rollout_shared = shared  # what the replicas generate the next rollout with
        self._worker_targets_stale = False

    def push_drafter(self, force: bool = False, owner_version: int | None = None) -> bool:
        """Load the newest drafter into every replica if its version changed; True if it was pushed.

        owner_version: the owner's current version if already known (from its status); when it equals the
        version the replicas run, the weights are not even fetched.
        """
        if not force and owner_version is not None and owner_version == self.pushed_version:
            return False
        latest = self.pool.latest_weights()
        if latest is None:
            return False
        version, weights = latest
        if version == self.pushed_version and not force:
            return False
        ref = ray.put(weights)
        calls = [server.update_drafter.remote(ref, version) for server in self.servers]
        failed = []
        for rank, call in enumerate(calls):
            try:
                ray.get(call, timeout=DRAFTER_SYNC_TIMEOUT_S)
            except Exception as error:  # a drafter that cannot be loaded must not fail the RL step
                failed.append(rank)
                logger.error(
                    "TLT: rollout replica %d could not load drafter version %d (%s: %s); it keeps its previous "
                    "drafter (or decodes plainly if it has none)",
                    rank,
                    version,
                    type(error).__name__,
                    error,
                )
        if failed:
            self.metrics["tlt/drafter/sync_failures"] = self.metrics.get("tlt/drafter/sync_failures", 0.0) + len(failed)
            return False  # pushed_version stays: the next step pushes again (replicas that have it skip the load)
        self.pushed_version = version
        return True

    def pop_metrics(self) -> dict[str, float]:
        metrics, self.metrics = self.metrics, {}
        return metrics

    # ----- checkpoints -----------------------------------------------------------------------------------------

    def save_checkpoint(self, step: int) -> None:
        """Queue the drafter's checkpoint with verl's checkpoint of `step`; `wait_for_save` completes it."""
        self.save(str(step_folder(self.config, step)), step)

    def save(self, step_dir: str, step: int) -> None:
        """Queue the drafter's checkpoint into verl's step folder (it waits for a busy owner; see DrafterPool.save)."""
        folder = Path(step_dir) / CHECKPOINT_DIR
        self._pending_save = (folder, step)
        self.pool.save(str(folder / "trainer"))

    def wait_for_save(self) -> None:
        """Wait for the drafter's checkpoint; only a complete one gets the meta file that `_restore` looks for.

        A checkpoint without the drafter is an error in the log and in tlt/drafter/checkpoint_failures: resuming
        from that step would restart the drafter.
        """
        pending, self._pending_save = self._pending_save, None
        if pending is None:
            return
        folder, step = pending
        result = self.pool.wait_for_save()
        self.metrics["tlt/drafter/checkpoint_wait_s"] = result.waited_s
        if not result.saved:
            self._checkpoint_failures += 1
            self.metrics["tlt/drafter/checkpoint_failures"] = float(self._checkpoint_failures)
            logger.error(
                "TLT: the drafter was not saved with verl's checkpoint of step %d (%s): %s; resuming from this step "
                "restarts the drafter from tlt.drafter.init=%s",
                step,
                folder.parent,
                result.reason,
                self.tlt.drafter.init,
            )
            return
        write_json(folder / META_FILE, {**result.info, "step": step})
        logger.info(
            "TLT: drafter version %d (%d optimizer steps) saved with verl's checkpoint of step %d%s",
            result.info["version"],
            result.info["total_steps"],
            step,
            f", after waiting {result.waited_s:.0f} s for its worker" if result.waited_s >= 1 else "",
        )

    def _restore(self, step_folder: Path) -> None:
        folder = step_folder / CHECKPOINT_DIR
        meta_path = folder / META_FILE
        if not meta_path.exists():
            logger.warning(
                "TLT: resuming from %s, which has no drafter checkpoint (%s); the drafter restarts from "
                "tlt.drafter.init=%s",
                step_folder,
                folder,
                self.tlt.drafter.init,
            )
            return
        meta = json.loads(meta_path.read_text())
        if not self.pool.load(str(folder / "trainer"), meta["version"], meta["total_steps"]):
            logger.warning(
                "TLT: the drafter checkpoint in %s could not be restored (see the drafter workers' errors); the "
                "drafter restarts from tlt.drafter.init=%s",
                folder,
                self.tlt.drafter.init,
            )
            return
        logger.info(
            "TLT: resuming at step %s with drafter version %d (%d optimizer steps) restored from %s",
            meta.get("step", step_folder.name),
            meta["version"],
            meta["total_steps"],
            folder,
        )


def _feature_layers(drafter, target_path: str) -> tuple[int, ...]:
    """The target layers the capture adds for the drafter (EAGLE-3's), from the target's depth and tlt.drafter."""
    num_layers = json.loads((Path(target_path) / "config.json").read_text())["num_hidden_layers"]
    return feature_layers_for(drafter.family, drafter.init, int(num_layers))
