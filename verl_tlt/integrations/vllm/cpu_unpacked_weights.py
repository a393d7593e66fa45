"""A ``vllm.general_plugins`` entry: on vLLM's CPU build, keep linear weights as plain tensors so they can be reloaded.

vLLM-CPU repacks every linear layer's weight for its oneDNN/SGL kernels after loading and then replaces
``layer.weight`` with an empty tensor. Any later in-place load (verl's actor -> rollout weight sync, TLT's drafter
updates) then fails (``'Parameter' object has no attribute 'weight_loader'``) or, worse, writes into a weight the
kernel no longer reads. With ``VERL_TLT_VLLM_CPU_UNPACKED_WEIGHTS=1`` this plugin makes those layers run
``torch.nn.functional.linear`` on their live weight instead (vLLM's own fallback path), so reloads take effect.
It costs speed on CPU only, never touches a GPU build, and does nothing without the variable.

vLLM calls ``register`` in every process it starts (front end, engine core, workers).
"""

from __future__ import annotations

import logging
import os

ENV = "VERL_TLT_VLLM_CPU_UNPACKED_WEIGHTS"
logger = logging.getLogger(__name__)


def register() -> None:
    if os.environ.get(ENV) != "1":
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import torch
    from vllm.model_executor.layers import utils

    if getattr(utils.dispatch_cpu_unquantized_gemm, "_verl_tlt_unpacked", False):
        return
    original = utils.dispatch_cpu_unquantized_gemm

    def dispatch_unpacked(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.is_meta or layer.weight.ndim != 2:
            original(layer, remove_weight)  # not a plain linear layer (meta, conv, MoE experts): vLLM's own path
            return
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    dispatch_unpacked._verl_tlt_unpacked = True
    utils.dispatch_cpu_unquantized_gemm = dispatch_unpacked
    logger.info("verl-tlt: vLLM-CPU keeps linear weights unpacked (%s=1), so weight reloads take effect", ENV)
