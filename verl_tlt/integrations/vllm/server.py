"""TLT's vLLM server: verl's ``vLLMHttpServer`` plus the control API the TLT trainer uses on every rollout server.

Selected only when TLT is on (``replica.TLTvLLMReplica`` swaps it in); every stock code path (weight sync,
sleep/wake, abort, the HTTP app) is verl's. What it adds:

- Engine arguments: the drafter named by ``tlt.drafter.init`` (never random) as vLLM's EAGLE-1
  ``speculative_config`` with the K schedule gated by ``tlt.speculative.threshold``, TLT's worker extension, and
  stat logging on (``_preprocess_engine_kwargs``).
- A stat logger in the engine's front end (``run_server`` adds it to ``AsyncLLM.from_vllm_config`` for that
  one call), so the server reads vLLM's per-step spec-decode stats (``sd_stats``).
- Per-rollout bookkeeping around ``generate``: arrivals, finishes, response lengths, in-flight count (the drain
  wait and the last record are ``control.bookkeeping``'s, shared with the torch server), closed when verl sleeps the
  replica.
- K=0 steps without the drafter: its first pass is deferred and caught up when it next drafts
  (``tlt.speculative.vllm_catch_up_window``, ``deferred_first_pass``).
- ``update_drafter(state, version)``: the drafter's weights become an export in a node-local directory and every
  worker loads them in place (``TLTWorkerExtension.tlt_load_drafter``); a failed load leaves the previous
  drafter running and raises, which the trainer logs.
- The drafter's self-test (``vllm.self_test``, ``tlt.drafter.self_test_*``) before each rollout's first request,
  so it sees the weights, the drafter and the awake engine that rollout will use, whatever verl's sleep, wake-up and
  weight sync did in between (on CPU, where the engine never sleeps, verl calls no wake-up at all). A version loaded
  since the last rollout that fails is refused: the previous one is loaded back. A drafter that passed before and
  fails now is reloaded from its files (what a sleep that lost its weights needs) and tested again; vLLM cannot
  switch speculation off in a running engine, so one that still fails keeps drafting until the next version
  (outputs stay exact; only speed suffers), logged as an error and counted as refused.
- ``target_shared_weights()``: the target's current embedding and LM head, for the drafter trainers.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from verl.workers.rollout.vllm_rollout import vllm_async_server
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

from verl_tlt.config import rollout_tlt_view
from verl_tlt.engine.drafts.self_test import DrafterSelfTest, Verdict
from verl_tlt.integrations.control.bookkeeping import RolloutBookkeeping
from verl_tlt.integrations.control.placement import visible_devices
from verl_tlt.integrations.vllm.compat import check_vllm_supports_tlt
from verl_tlt.integrations.vllm.drafter_files import drafter_root, exchange_bytes
from verl_tlt.integrations.vllm.engine_setup import TLT_WORKER_EXTENSION, cpu_engine_env, speculative_engine_args
from verl_tlt.integrations.vllm.self_test import DrafterExports, probe_vllm_drafter
from verl_tlt.integrations.vllm.spec_stats import SpecStepCounter, stat_logger_factory
from verl_tlt.metrics.rollout_trace import RolloutTrace

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

INITIAL_VERSION = -1  # the drafter the engine started with (tlt.drafter.init), before any push


class TLTvLLMHttpServer(RolloutBookkeeping, vLLMHttpServer):
    """verl's vLLM server with TLT's drafter, stats and rollout records; implements control.contract.RolloutControl."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tlt = rollout_tlt_view(self.config)
        self.counter = SpecStepCounter(self.tlt.speculative.gate)
        self.trace = RolloutTrace(self.replica_rank)
        self.last_rollout: dict[str, Any] | None = None
        self._in_flight = 0
        self._kv_lent = False  # the KV cache is freed for a drafter burst (free_for_training)
        self._kv_lock = asyncio.Lock()
        drafter = self.tlt.drafter
        need = exchange_bytes(self.model_config.hf_config, drafter.family, drafter.draft_vocab_size)
        self._root = drafter_root(self.replica_rank, need)
        drafter = self.tlt.drafter
        max_len = self.config.max_model_len or self.config.prompt_length + self.config.response_length
        self._self_test = DrafterSelfTest(drafter.self_test_tokens, drafter.self_test_min_ratio, max_len)
        self._self_test_lock = asyncio.Lock()
        self._self_test_runs = 0  # for the probes' request ids
        self._test_due = False  # a rollout ended (or a drafter loaded) since the last test: test before the next one
        self._exports: DrafterExports | None = None  # set with the start-up drafter
        # The exports can be large for a large target (and live in RAM under /dev/shm): gone with the server.
        atexit.register(shutil.rmtree, self._root, ignore_errors=True)

    # ----- engine start-up ---------------------------------------------------------------------------------------

    def _get_worker_extension_cls(self) -> str:
        return TLT_WORKER_EXTENSION

    def _preprocess_engine_kwargs(self, engine_kwargs: dict) -> None:
        super()._preprocess_engine_kwargs(engine_kwargs)
        check_vllm_supports_tlt()
        for key in ("speculative_config", "worker_extension_cls"):
            if engine_kwargs.get(key) is not None:
                raise ValueError(
                    f"actor_rollout_ref.rollout.engine_kwargs.vllm.{key} is set ({engine_kwargs[key]!r}), but with "
                    f"tlt.enabled=true TLT sets it (its drafter, K schedule and worker extension). Fix: remove that "
                    "override, or run with tlt.enabled=false."
                )
        from verl_tlt.drafter.initial import initial_drafter_export

        self._exports = DrafterExports(
            initial_drafter_export(
                self.tlt.drafter.init,
                self.model_config.local_path,
                self._root / "initial",
                self.tlt.drafter.family,
                draft_vocab_size=self.tlt.drafter.draft_vocab_size,
            ),
            INITIAL_VERSION,
        )
        engine_kwargs.update(
            speculative_engine_args(self.tlt.speculative, str(self._exports.folder), self.config.max_num_seqs)
        )
        engine_kwargs["disable_log_stats"] = False  # the spec-decode stats reach stat loggers only with it
        if _is_cpu_build():
            cpu_engine_env()
        logger.info(
            "TLT vLLM server %d: drafter %s, speculative_config %s",
            self.replica_rank,
            self._exports.folder,
            engine_kwargs["speculative_config"],
        )

    async def run_server(self, args: Any) -> None:
        stock = vllm_async_server.AsyncLLM
        factory = stat_logger_factory(self.counter)

        class AsyncLLMWithTLTStats(stock):
            @classmethod
            def from_vllm_config(cls, *f_args: Any, **f_kwargs: Any):
                f_kwargs["stat_loggers"] = [*(f_kwargs.get("stat_loggers") or []), factory]
                return stock.from_vllm_config(*f_args, **f_kwargs)

        vllm_async_server.AsyncLLM = AsyncLLMWithTLTStats  # this actor's process only, for this one call
        try:
            await super().run_server(args)
        finally:
            vllm_async_server.AsyncLLM = stock
        # Load the start-up drafter's weights into every worker, even though vLLM was given its directory: with
        # verl's default rollout.load_format=dummy vLLM initialises the drafter randomly too. The load also leaves a
        # CPU copy in each worker, so a level-2 sleep cannot lose it.
        await self.engine.collective_rpc("tlt_load_drafter", args=(str(self._exports.folder), INITIAL_VERSION))
        window = self.tlt.speculative.vllm_catch_up_window
        if window > 0:  # K=0 steps skip the drafter, caught up when it next drafts (deferred_first_pass)
            results = await self.engine.collective_rpc("tlt_install_catch_up", args=(window,))
            logger.info("TLT vLLM server %d: deferred drafter first pass %s", self.replica_rank, results)

    # ----- requests ----------------------------------------------------------------------------------------------

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, *args: Any, **kwargs: Any
    ):
        # Counted from the start: a replica with a request on its way never lends its KV cache (free_for_training).
        self._in_flight += 1
        try:
            if self._kv_lent:  # a request after the replica drained and lent its KV cache to a burst: take it back
                await self.restore_after_training()
            if self._test_due:
                async with self._self_test_lock:  # every request waits for the test; the first one runs it
                    if self._test_due:
                        await self._self_test_before_rollout()
            self._self_test.remember(prompt_ids)  # its probe: the first prompt served (a no-op once it has one)
            self.trace.on_submit()
            output = await super().generate(prompt_ids, sampling_params, request_id, *args, **kwargs)
        finally:
            self._in_flight -= 1
        self.trace.on_finish(len(output.token_ids), {})
        return output

    def _num_in_flight(self) -> int:
        return self._in_flight

    async def sleep(self) -> None:
        # The rollout phase is over when verl sleeps the replicas: close this replica's record of it first.
        await self.restore_after_training()  # vLLM's sleep expects the KV cache it allocated (normally a no-op)
        self._close_rollout(validation=False)
        self._test_due = self._self_test.enabled
        await super().sleep()

    # ----- lending the drained engine's memory to the drafter -------------------------------------------------------

    def accelerator_ids(self) -> list[str]:
        """The GPUs this replica's engine runs on (verl sets them in the server's environment); none on CPU."""
        if _is_cpu_build():
            return []
        from verl.utils.device import get_visible_devices_keyword

        return visible_devices(os.environ.get(get_visible_devices_keyword()))

    def cpu_cores(self) -> list[int]:
        """Not pinned: vLLM's CPU build binds its own OpenMP threads (VLLM_CPU_OMP_THREADS_BIND), and a GPU replica's
        drafter worker trains on the GPU; the drafter worker then runs where the OS places it."""
        return []

    async def free_for_training(self) -> bool:
        """The replica drained: free its KV cache for the drafter's burst (sleep level 1 keeps the weights in host
        memory, and waking the weights alone brings them back without the KV cache). Only where verl sleeps and
        wakes this engine between rollouts anyway (``free_cache_engine`` in hybrid mode): elsewhere vLLM's memory
        is left as verl manages it. True if freed."""
        from verl.workers.rollout.replica import RolloutMode

        if _is_cpu_build() or not self.config.free_cache_engine or self.rollout_mode != RolloutMode.HYBRID:
            return False
        async with self._kv_lock:
            if self._kv_lent or self._in_flight or self.node_rank != 0:
                return False
            # Set first: a request that arrives during the sleep (which aborts what runs) sees it and waits for this
            # lock in restore_after_training, then takes the KV cache back before it reaches the engine.
            self._kv_lent = True
            try:
                await self.engine.sleep(level=1)
                await self.engine.wake_up(tags=["weights"])
            except Exception:
                await self.engine.wake_up()  # whatever the sleep got to: everything back, nothing lent
                self._kv_lent = False
                raise
        return True

    async def restore_after_training(self) -> None:
        """Allocate the KV cache `free_for_training` freed again (the burst has ended and offloaded)."""
        async with self._kv_lock:
            if not self._kv_lent:
                return
            await self.engine.wake_up(tags=["kv_cache"])
            await self.engine.reset_prefix_cache()
            self._kv_lent = False

    def _close_rollout(self, validation: bool) -> None:
        self.trace.sd_totals = self.counter.take_totals()
        record = self._close_rollout_record({"drafter_version": self.drafter_version()}, validation)
        if record is not None:
            record.pop("engine_busy_s", None)  # vLLM does not report its step times: no number rather than a 0

    def end_validation(self) -> None:
        """verl validates without sleeping the replicas: keep validation out of the next rollout's record and stats."""
        self._close_rollout(validation=True)
        self.counter.take_stats(reset=True)

    def sd_stats(self, reset: bool = True) -> dict[str, Any]:
        stats = self.counter.take_stats(reset)
        if self._self_test.enabled:
            stats["self_test"] = self._self_test.take() if reset else self._self_test.counts()
        return stats

    # ----- drafter -------------------------------------------------------------------------------------------------

    def drafter_version(self) -> int | None:
        return self._exports.version if self._exports is not None else None

    async def update_drafter(self, state: dict[str, torch.Tensor], version: int) -> bool:
        """Load drafter weights `version` (a drafter state dict, either family) into every worker; False if loaded."""
        if version == self._exports.version:
            return False
        from verl_tlt.integrations.vllm.drafter_files import export_drafter_state

        folder = self._root / f"v{version}"
        export_drafter_state(state, self.model_config.hf_config, folder, version)
        loaded = await self._load_into_workers(folder, version)
        # Tested before the next rollout; the last tested drafter's files stay until this one passes.
        self._remove_exports(self._exports.loaded(folder, version))
        if self._self_test.enabled:
            self._test_due = True
        else:
            self._remove_exports(self._exports.tested(passed=True)[1])
        logger.info(
            "TLT vLLM server %d: drafter version %d loaded (%d workers)", self.replica_rank, version, len(loaded)
        )
        return True

    async def _load_into_workers(self, folder: Path, version: int) -> list[dict]:
        results = await self.engine.collective_rpc("tlt_load_drafter", args=(str(folder), version))
        loaded = [r for r in results or [] if r and r.get("version") == version]
        if not loaded:
            raise RuntimeError(f"TLT: no vLLM worker of replica {self.replica_rank} reported drafter version {version}")
        return loaded

    async def _self_test_drafter(self) -> Verdict:
        """The self-test on the drafter the workers run now, through the stock generate (none of this server's
        rollout bookkeeping sees the probe). Call with nothing else in flight."""

        async def probe(prompt_ids: list[int], tokens: int) -> Any:
            self._self_test_runs += 1
            params = {"temperature": 0.0, "max_tokens": tokens, "ignore_eos": True}
            request_id = f"tlt-self-test-{self.replica_rank}-{self._self_test_runs}"
            return await vLLMHttpServer.generate(self, prompt_ids, params, request_id)

        return await probe_vllm_drafter(self._self_test, self.counter, probe)

    async def _self_test_before_rollout(self) -> None:
        """Test the drafter the rollout is about to use; refuse a new version that fails, repair an old one that
        fails (see the module's doc)."""
        verdict = await self._self_test_drafter()
        refused = self._exports.version
        fallback, unused = self._exports.tested(verdict.passed)
        if fallback is not None:
            await self._load_into_workers(*fallback)
            logger.warning(
                "TLT vLLM server %d: drafter version %s refused by the self-test (%s); back to version %s",
                self.replica_rank,
                refused,
                verdict.reason,
                self._exports.version,
            )
        elif not verdict.passed:
            logger.warning(
                "TLT vLLM server %d: drafter version %s failed its self-test (%s); reloading it from %s",
                self.replica_rank,
                self._exports.version,
                verdict.reason,
                self._exports.folder,
            )
            await self._load_into_workers(self._exports.folder, self._exports.version)
            verdict = await self._self_test_drafter()
            if not verdict.passed:
                logger.error(
                    "TLT vLLM server %d: drafter version %s fails its self-test after a reload too (%s); it keeps "
                    "drafting until the next version (vLLM cannot switch speculation off in a running engine: "
                    "outputs stay exact, only speed suffers)",
                    self.replica_rank,
                    self._exports.version,
                    verdict.reason,
                )
        self._remove_exports(unused)
        self._test_due = False

    def _remove_exports(self, folders: list[Path]) -> None:
        """Delete pushed versions' exports (never the start-up drafter's, which a refusal may fall back to)."""
        for folder in folders:
            if folder.parent == self._root and folder.name != "initial":
                shutil.rmtree(folder, ignore_errors=True)

    async def target_shared_weights(self) -> dict[str, torch.Tensor]:
        """The target's embedding (and LM head unless tied) under transformers names, whole (TP shards joined)."""
        from safetensors.torch import load_file

        folder = self._root / "shared"
        folder.mkdir(exist_ok=True)
        paths = await self.engine.collective_rpc("tlt_save_shared_weights", args=(str(folder),))
        shards = [load_file(path) for path in paths]  # in rank order: vocabulary shards of tensor parallelism
        for path in paths:  # an embedding can be gigabytes, in RAM under /dev/shm: not kept after reading
            os.unlink(path)
        vocab = self.model_config.hf_config.vocab_size
        return {name: torch.cat([shard[name] for shard in shards], dim=0)[:vocab].clone() for name in shards[0]}


def _is_cpu_build() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
