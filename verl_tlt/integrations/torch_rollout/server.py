"""The torch rollout server: a Ray actor per rollout replica that serves verl's token-in/token-out requests.

verl's agent loops call `generate(prompt_ids, sampling_params, request_id)` concurrently; every call becomes a
request in one RolloutEngine, which a background thread steps with continuous batching. The actor mirrors the
methods verl calls on its vLLM server (wake_up/sleep/KV/abort/profile), most of which have nothing to release
on CPU.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from typing import Any

import torch

from verl_tlt.config import TLTConfig, rollout_tlt_view
from verl_tlt.cpu_affinity import available_cores, pin_process
from verl_tlt.engine import CompletionOutput, GroupDrafts, RolloutEngine, SamplingParams
from verl_tlt.engine.drafts.self_test import DrafterSelfTest
from verl_tlt.integrations.control.bookkeeping import RolloutBookkeeping
from verl_tlt.integrations.control.placement import replica_cpu_cores
from verl_tlt.integrations.torch_rollout.options import engine_config, torch_rollout_config
from verl_tlt.integrations.torch_rollout.policy_costs import refresh_policy_costs
from verl_tlt.metrics.rollout_trace import RolloutTrace, append_jsonl, weights_sha256
from verl_tlt.modeling.model import UnsupportedModelError
from verl_tlt.modeling.torch_threads import with_torch_threads
from verl_tlt.policy.adaptive import AdaptivePolicy
from verl_tlt.request_seeds import GROUP_KWARG

logger = logging.getLogger(__name__)
# Like verl's own modules: INFO unless VERL_LOGGING_LEVEL says otherwise, so the server's start-up (its cores, its
# timed step costs) shows in the run log.
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(
            f"actor_rollout_ref.rollout.dtype={name!r} is not supported by the torch rollout; "
            f"use one of {list(_DTYPES)}"
        )
    return _DTYPES[name]


class TorchRolloutServer(RolloutBookkeeping):
    """Ray actor (created by TorchReplica) owning one RolloutEngine; implements control.contract.RolloutControl."""

    def __init__(self, config, model_config, replica_rank: int, node_slot: tuple[int, int] | None = None):
        """node_slot: (this replica's index among the replicas on its node, how many there are): its share of the
        node's cores (`control.placement.replica_cpu_cores`); None = unpinned."""
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        self.config, self.replica_rank = config, replica_rank
        self.node_slot = node_slot
        self._cpu_cores: list[int] = []
        self.model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.global_steps: int | None = None
        self.engine: RolloutEngine | None = None
        self._futures: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._ids = itertools.count()
        self._work = threading.Event()
        self._engine_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._drafter_sync = None  # created on the first update_drafter (TLT only)
        self.trace = RolloutTrace(replica_rank)
        self.last_rollout: dict[str, Any] | None = None
        self._trace_path: str | None = None
        self._seeded = 0  # requests of the current rollout that came with a sampling seed (in the trace record)
        # Requests of the current rollout that named their GRPO group, and the groups (group drafts; trace record).
        self._grouped = 0
        self._groups: set = set()
        self._submit_index: dict[str, int] = {}  # internal request id -> its position in the trace's submit_times
        self._weights_sha256: str | None = None  # of the loaded target weights; computed lazily, reset by each load

    def init_engine(self) -> None:
        options = torch_rollout_config(self.config)
        self._trace_path = options.trace_path
        self._pin_to_cores(options.cpu_affinity)
        torch.set_num_threads(options.num_threads)
        tlt = rollout_tlt_view(self.config)
        group_drafts, policy = tlt_speculation(tlt)
        self.engine = _build_engine(
            self.model_config.local_path,
            config=engine_config(self.config, options, self.replica_rank),
            dtype=resolve_dtype(self.config.dtype),
            group_drafts=group_drafts,
            policy=policy,
        )
        self._self_test = None
        if tlt.enabled:
            drafter = tlt.drafter
            self._self_test = DrafterSelfTest(
                drafter.self_test_tokens, drafter.self_test_min_ratio, self.engine.max_model_len
            )
        self._tested_since_sleep = False  # a drafter load ran the self-test since the last sleep
        self._wake_test_due = False  # woken with no test since the sleep: test before the rollout's first request
        self._thread = threading.Thread(
            target=with_torch_threads(self._run_engine, options.num_threads),
            name=f"torch-rollout-{self.replica_rank}",
            daemon=True,
        )
        self._thread.start()
        plan = self.engine.runner.kernel_plan
        logger.info(
            "torch rollout server %d ready (%s); CPU linear kernels: %s",
            self.replica_rank,
            self.model_config.local_path,
            "default" if plan is None else plan.describe(),
        )

    # ----- token-in/token-out --------------------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: Any = None,
        priority: int = 0,
        **kwargs: Any,
    ):
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None or audio_data is not None:
            raise ValueError(
                "The torch rollout engine serves text-only models; use actor_rollout_ref.rollout.name=vllm for "
                "multimodal ones"
            )
        prompt_ids = [int(t) for t in prompt_ids]
        try:
            params = SamplingParams.from_request_dict(
                sampling_params, default_max_tokens=self._default_max_tokens(prompt_ids)
            )
        except ValueError as error:
            raise ValueError(
                f"{str(error).rstrip('.')}. Fix: have the agent loop send only what the torch rollout supports, or "
                "serve it with actor_rollout_ref.rollout.name=vllm."
            ) from error
        room = self.engine.max_model_len - len(prompt_ids)
        if params.max_tokens > room:
            params = SamplingParams(**{**params.__dict__, "max_tokens": max(1, room)})
        self._seeded += params.seed is not None
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        internal_id = f"{request_id}#{next(self._ids)}"
        self._futures[internal_id] = (loop, future)
        self._submit_index[internal_id] = self.trace.on_submit()
        if self._self_test is not None:
            self._self_test.remember(prompt_ids)  # its probes: the first prompts served (a no-op once it has them)
        if self._wake_test_due:  # after remembering: the first rollout's first prompt is the probe, so even the
            self._wake_up_self_test()  # first rollout's policy knows its drafter's acceptance
        # The slot-seeded agent loop names each request's GRPO group (group drafts); other callers send none.
        group = kwargs.get(GROUP_KWARG)
        if group is not None:
            self._grouped += 1
            self._groups.add(group)
        self.engine.add_request(prompt_ids, params, request_id=internal_id, group=group)
        self._work.set()
        output: CompletionOutput = await future
        return TokenOutput(
            token_ids=output.token_ids,
            log_probs=output.log_probs,
            stop_reason="aborted" if output.finish_reason == "abort" else "completed",
            num_preempted=0,
            extra_fields={"global_steps": self.global_steps},
        )

    def _default_max_tokens(self, prompt_ids: list[int]) -> int:
        # Same default as verl's vLLM server: the response length, capped by the remaining budget.
        return min(
            self.config.response_length, self.config.prompt_length + self.config.response_length - len(prompt_ids)
        )

    def _run_engine(self) -> None:
        while True:
            self._work.wait()
            self._work.clear()
            while True:
                try:
                    with self._engine_lock:
                        if not self.engine.has_unfinished():
                            break
                        began = time.perf_counter()
                        finished = self.engine.step()
                        self.trace.on_engine_step(time.perf_counter() - began)
                except Exception as error:  # a crashed engine thread would hang every caller: fail them instead
                    logger.exception("torch rollout server %d: engine step failed", self.replica_rank)
                    self._fail_all(error)
                    break
                for output in finished:
                    submitted = self._submit_index.pop(output.request_id, None)
                    self.trace.on_finish(len(output.token_ids), output.stats, submitted)
                    loop, future = self._futures.pop(output.request_id)
                    loop.call_soon_threadsafe(_resolve, future, output)

    def _fail_all(self, error: Exception) -> None:
        with self._engine_lock:
            self.engine.reset()
        futures, self._futures = self._futures, {}
        for loop, future in futures.values():
            loop.call_soon_threadsafe(_fail, future, error)

    # ----- control API used by verl ---------------------------------------------------------------------------

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], global_steps: int | None = None) -> int:
        with self._engine_lock:
            loaded = self.engine.load_weights(named_tensors)
            self._weights_sha256 = None
        if global_steps is not None:
            self.global_steps = global_steps
        return loaded

    # ----- TLT: drafter and speculative-decoding stats --------------------------------------------------------

    def update_drafter(self, state: dict[str, torch.Tensor], version: int) -> bool:
        """Load drafter weights `version`; False if already loaded or refused by the self-test (the previous drafter
        kept)."""
        from verl_tlt.engine.drafter_sync import DrafterSync

        with self._engine_lock:
            if self._drafter_sync is None:
                self._drafter_sync = DrafterSync(self.engine, self._self_test)
            runs = self._self_test.runs if self._self_test is not None else 0
            loaded = self._drafter_sync.update(state, version)
            if self._self_test is not None and self._self_test.runs > runs:
                self._tested_since_sleep, self._wake_test_due = True, False
            if loaded:
                self._refresh_costs()
            return loaded

    def target_shared_weights(self) -> dict[str, torch.Tensor]:
        """The target's embedding and LM head (transformers names), which an EAGLE drafter shares, on CPU."""
        with self._engine_lock:
            views = self.engine.model.drafter_shared_views()
            return {name: view.detach().to("cpu", copy=True) for name, view in views.items()}

    def drafter_version(self) -> int | None:
        return self._drafter_sync.version if self._drafter_sync is not None else None

    def sd_stats(self, reset: bool = True) -> dict[str, Any]:
        """The engine's plain/SD step counters since the last call (reset=True) or since start."""
        with self._engine_lock:
            stats = self.engine.stats.take() if reset else self.engine.stats.as_dict()
            stats["drafter_error"] = self.engine.drafter_error
            if isinstance(self.engine.policy, AdaptivePolicy):
                stats["policy"] = self.engine.policy.take_report() if reset else None
            if self._self_test is not None:
                stats["self_test"] = self._self_test.take() if reset else self._self_test.counts()
        return stats

    def _refresh_costs(self) -> None:
        """After a drafter load or a passing wake-up test (engine idle, lock held): the policy's costs and the
        drafter's probed acceptance (`policy_costs.refresh_policy_costs`)."""
        probe = self._self_test.reference if self._self_test is not None else None
        refresh_policy_costs(self.engine, probe, self.replica_rank, self.drafter_version())

    def _num_in_flight(self) -> int:
        return len(self._futures)

    async def wait_for_requests_to_drain(self) -> None:
        while self._futures:
            await asyncio.sleep(0.01)

    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        ids = list(self._futures)
        for request_id in ids:
            self.engine.abort(request_id)
        self._work.set()
        return {"aborted_count": len(ids), "request_ids": ids}

    def abort_request(self, request_id: str) -> dict[str, Any]:
        matches = [i for i in self._futures if i.rsplit("#", 1)[0] == request_id]
        for internal_id in matches:
            self.engine.abort(internal_id)
        self._work.set()
        return {"aborted": bool(matches), "request_id": request_id}

    def clear_kv_cache(self) -> None:
        # Slots are rewritten from the prompt on admission; nothing survives between requests.
        return None

    # ----- lending the drained engine's memory to the drafter (control contract) -----------------------------------

    def accelerator_ids(self) -> list[str]:
        return []  # verl's torch rollout runs on the host CPU

    def cpu_cores(self) -> list[int]:
        return list(getattr(self, "_cpu_cores", []))

    def _pin_to_cores(self, enabled: bool) -> None:
        """This replica's share of its node's cores (control.placement), where the replica knows its slot."""
        slot = getattr(self, "node_slot", None)
        if not enabled or slot is None:
            return
        index, count = slot
        cores = replica_cpu_cores(available_cores(), index, count)
        self._cpu_cores = pin_process(cores)
        logger.info(
            "torch rollout server %d pinned to CPU cores %s (replica %d of %d on its node)",
            self.replica_rank,
            self._cpu_cores,
            index + 1,
            count,
        )

    def free_for_training(self) -> bool:
        """The replica drained: give its KV cache back to the host for the drafter's burst (True if freed)."""
        with self._engine_lock:
            if self.engine.has_unfinished():
                return False
            self.engine.release_cache()
        return True

    def restore_after_training(self) -> None:
        return None  # the engine allocates its KV cache again at its next request

    def release_kv_cache(self) -> None:
        with self._engine_lock:
            if not self.engine.has_unfinished():
                self.engine.release_cache()

    def sleep(self) -> None:
        # The rollout phase is over when verl sleeps the replicas: close this replica's record of it.
        extra = {"drafter_version": self.drafter_version(), **self._take_request_counts()}
        with self._engine_lock:
            extra["decode_costs"] = self.engine.decode_costs.take()
            if self._trace_path and self.trace.start is not None:
                extra["weights_sha256"] = self._loaded_weights_sha256()
        record = self._close_rollout_record(extra, validation=False)
        if record is not None and self._trace_path:
            append_jsonl(self._trace_path, record)
        self.release_kv_cache()
        self._tested_since_sleep = False

    def _loaded_weights_sha256(self) -> str:
        # Only for the trace file (a few ms per rollout on the toy target, more on a big one): weights change only
        # through update_weights, so one digest per load. Called with the engine lock held.
        if self._weights_sha256 is None:
            self._weights_sha256 = weights_sha256(self.engine.model)
        return self._weights_sha256

    def end_validation(self) -> None:
        """Keep what verl's validation generated out of the next training rollout's record and SD counters.

        verl validates without sleeping the replicas, so its requests would otherwise open the next training
        rollout's record (its start, extra responses) and count as that step's speculative decoding. The record
        is still written to trace_path, marked as validation.
        """
        with self._engine_lock:
            costs = self.engine.decode_costs.take()
        extra = {"drafter_version": self.drafter_version(), "decode_costs": costs, **self._take_request_counts()}
        record = self._close_rollout_record(extra, validation=True)
        if record is not None and self._trace_path:
            append_jsonl(self._trace_path, record)
        self.sd_stats(reset=True)

    def _take_request_counts(self) -> dict[str, int]:
        """Requests of the record being closed that came seeded and grouped, and their groups; starts afresh."""
        counts = {"seeded_requests": self._seeded, "grouped_requests": self._grouped, "groups": len(self._groups)}
        self._seeded = self._grouped = 0
        self._groups = set()
        return counts

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Weights stay resident on CPU and the cache regrows on demand; what a wake-up does is schedule the drafter's
        self-test, unless a drafter load tested it since the last sleep. verl wakes the weights, loads new ones,
        wakes the KV cache, and may load a new drafter only then: the test runs before the rollout's first request
        (`_wake_up_self_test`), so it sees the weights and the drafter the rollout will use, and is skipped when a
        load tested them, or when the policy already found that drafter cannot pay: the replica then decodes plainly
        but for the bandit's probes, which keep its acceptance current, and the test would only cost the rollout
        (0.8-1 s a rollout on SmolLM2 on 2 cores)."""
        if tags is None or "kv_cache" in tags:
            due = self._self_test is not None and not self._tested_since_sleep
            self._wake_test_due = due and not self._drafter_cannot_pay()
        return None

    def _drafter_cannot_pay(self) -> bool:
        policy = self.engine.policy if self.engine is not None else None
        return isinstance(policy, AdaptivePolicy) and policy.cannot_pay() is not None

    def _wake_up_self_test(self) -> None:
        """The wake-up self-test: a drafter that fails it is dropped (plain decoding) until the next version."""
        self._wake_test_due = False
        if self._drafter_sync is None:
            return
        with self._engine_lock:
            if self.engine.has_unfinished() or self.engine.drafter is None:
                return
            verdict = self._self_test.check(self.engine)
            self._tested_since_sleep = True
            if verdict.passed:
                self._refresh_costs()
            else:
                logger.warning(
                    "torch rollout server %d: drafter version %s failed its wake-up self-test (%s); decoding plainly "
                    "until the next drafter version",
                    self.replica_rank,
                    self._drafter_sync.version,
                    verdict.reason,
                )
                self._drafter_sync.drop()

    # Nothing to do on CPU: the cache regrows on demand, profiling is not wired.

    def resume_kv_cache(self) -> None:
        return None

    def resume_generation(self) -> None:
        return None

    def start_profile(self, **kwargs: Any) -> None:
        return None

    def stop_profile(self) -> None:
        return None


def _build_engine(model_path: str, **kwargs: Any) -> RolloutEngine:
    """RolloutEngine.from_pretrained, with the verl key that serves a model this engine cannot run."""
    try:
        return RolloutEngine.from_pretrained(model_path, **kwargs)
    except UnsupportedModelError as error:
        raise UnsupportedModelError(
            f"The model at {model_path} (actor_rollout_ref.model.path): {error} Fix: serve it with "
            "actor_rollout_ref.rollout.name=vllm (TLT needs the torch rollout), or train a model the torch rollout "
            "supports."
        ) from error


def _fail(future: asyncio.Future, error: Exception) -> None:
    if not future.done():
        future.set_exception(RuntimeError(f"torch rollout engine failed: {error!r}"))


def _resolve(future: asyncio.Future, output: CompletionOutput) -> None:
    if not future.done():
        future.set_result(output)


def tlt_speculation(tlt: TLTConfig) -> tuple[GroupDrafts | None, AdaptivePolicy | None]:
    """What an engine speculates with under `tlt` (tlt.speculative), built once at server start: the group drafts
    (they index requests from admission on, so they exist from the first request) and the adaptive policy; none with
    TLT off. The drafter comes later, with its first weights (update_drafter); until then every step is plain."""
    if not tlt.enabled:
        return None, None
    speculative = tlt.speculative
    group_drafts = None
    if speculative.group_drafts:
        group_drafts = GroupDrafts(speculative.suffix_min_match, speculative.suffix_history_tokens)
    return group_drafts, AdaptivePolicy(speculative)
