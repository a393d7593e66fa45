"""A ``vllm.general_plugins`` entry for vLLM's CPU build: reloadable weights, and lossless speculative sampling.

1. Reloadable weights (only with ``VERL_TLT_VLLM_CPU_UNPACKED_WEIGHTS=1``):

vLLM-CPU repacks every linear layer's weight for its oneDNN/SGL kernels after loading and then replaces
``layer.weight`` with an empty tensor. Any later in-place load (verl's actor -> rollout weight sync, TLT's drafter
updates) then fails (``'Parameter' object has no attribute 'weight_loader'``) or, worse, writes into a weight the
kernel no longer reads. With ``VERL_TLT_VLLM_CPU_UNPACKED_WEIGHTS=1`` this plugin makes those layers run
``torch.nn.functional.linear`` on their live weight instead (vLLM's own fallback path), so reloads take effect.
It costs speed on CPU only, never touches a GPU build, and does nothing without the variable.

2. Speculative sampling (always, on the CPU build): vLLM-CPU 0.27 replaces the rejection sampler's Triton
``expand_kernel`` with a C++ one whose wrapper converts the output tensor to int64 and never copies the result
back (``vllm/utils/cpu_triton_utils.py``, ``_expand_kernel_impl``; its sibling wrappers do copy back). Every
per-request temperature, top-k and top-p of a speculative step is then read from uninitialised memory: sampled
speculative decoding is not lossless (with top-k it crashes the engine, "selected index k out of range"). This
replaces that wrapper with an exact torch one. Greedy decoding never reads those tensors.

vLLM calls ``register`` in every process it starts (front end, engine core, workers).
"""

from __future__ import annotations

import logging
import os

ENV = "VERL_TLT_VLLM_CPU_UNPACKED_WEIGHTS"
logger = logging.getLogger(__name__)


def register() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    _fix_expand_kernel()
    if os.environ.get(ENV) == "1":
        _keep_weights_unpacked()


def expand_to_tokens(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:  # noqa: N803
    """What the rejection sampler's ``expand_kernel`` computes: each request's value (``replace_from`` swapped for
    ``replace_to``) repeated over its draft tokens, written into `output` in place."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    replaced = torch.full_like(input_val, replace_to)
    values = torch.where(input_val == replace_from, replaced, input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()] = expanded.to(output.dtype)


def _fix_expand_kernel() -> None:
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:  # a vLLM without the CPU Triton fallbacks has nothing to fix
        return
    wrapper = getattr(cpu_triton_utils, "expand_kernel", None)
    if wrapper is None or getattr(wrapper, "_verl_tlt_fixed", False):
        return
    fixed = cpu_triton_utils._FuncWrapper(expand_to_tokens)
    fixed._verl_tlt_fixed = True
    cpu_triton_utils.expand_kernel = fixed
    logger.info("verl-tlt: vLLM-CPU's rejection-sampler expand kernel replaced (sampled SD reads real parameters)")


def _keep_weights_unpacked() -> None:
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
