"""The engine arguments TLT adds to a vLLM engine, shared by the TLT server in verl and the local engine.

Pure except for ``cpu_engine_env`` (environment variables for vLLM's CPU build); no vLLM import.
"""

from __future__ import annotations

import os

from verl_tlt.config import SpeculativeConfig
from verl_tlt.integrations.vllm.cpu_build_fixes import ENV as UNPACKED_WEIGHTS_ENV
from verl_tlt.integrations.vllm.empty_draft_fetch import ENV as SKIP_EMPTY_DRAFT_FETCH_ENV
from verl_tlt.integrations.vllm.k_scheduler import POLICY_ENV, policy_env_value
from verl_tlt.integrations.vllm.speculative_config import build_speculative_config, chain_depths

TLT_WORKER_EXTENSION = "verl_tlt.integrations.vllm.worker_extension.TLTWorkerExtension"
TLT_SCHEDULER = "verl_tlt.integrations.vllm.k_scheduler.TLTKScheduler"


def speculative_engine_args(
    speculative: SpeculativeConfig,
    drafter_dir: str,
    max_num_seqs: int,
    *,
    adaptive: bool = True,
    catch_up_window: int | None = None,
    skip_empty_draft_fetch: bool | None = None,
) -> dict:
    """``speculative_config`` (EAGLE-1 from `drafter_dir`, K schedule gated by the threshold) and, with
    `adaptive`, TLT's scheduler, whose policy picks K per step (``k_scheduler``).

    The policy's config, and whether K=0 steps skip the draft fetch (`skip_empty_draft_fetch`; None: where the
    drafter's first pass is deferred, `catch_up_window`, default ``speculative.vllm_catch_up_window``, > 0), are put
    in this process's environment, which vLLM's engine-core process inherits when it starts.
    """
    window = speculative.vllm_catch_up_window if catch_up_window is None else catch_up_window
    skip = window > 0 if skip_empty_draft_fetch is None else skip_empty_draft_fetch
    os.environ[SKIP_EMPTY_DRAFT_FETCH_ENV] = "1" if skip else "0"
    config = build_speculative_config(speculative, drafter_dir, max_num_seqs, adaptive=adaptive)
    args: dict = {"speculative_config": config}
    if adaptive:
        os.environ[POLICY_ENV] = policy_env_value(speculative, chain_depths(speculative))
        args["scheduler_cls"] = TLT_SCHEDULER
    return args


def cpu_engine_env() -> None:
    """On vLLM's CPU build: weights that reloads reach, and a small KV cache (GiB) unless the user set one.

    Set in this process before the engine starts; vLLM's engine core and workers inherit the environment.
    """
    os.environ.setdefault(UNPACKED_WEIGHTS_ENV, "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
