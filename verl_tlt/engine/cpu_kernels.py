"""How a RolloutEngine's linear layers run on the CPU: weight layouts on or off, and which kernel at which row count.

`cpu_layouts` (None: auto) turns the weight-copy layouts on for fp32 and bf16 models on the CPU up to
CPU_LAYOUTS_MAX_BYTES (each layer may keep copies for the kernels it uses). `cpu_kernels` then says how each layer
picks its kernel:
- "measure" (default): measured on this host for the model's shapes at decode and verify row counts, cached per
  host (`modeling.kernel_plan`); the fastest candidate wins, the default BLAS call unless another is clearly faster.
- "thresholds": the size thresholds of `modeling.cpu_linear`, fp32 only (what the engine did before measuring).
- a kernel name ("linear", "by_column", "packed", "matrix_vector"): that kernel everywhere it can run
  (matrix_vector computes single rows only; other products then run "linear"). Tests force each candidate this way.
"""

from __future__ import annotations

import torch

from verl_tlt.modeling.kernel_plan import KernelPlan, force_kernel, plan_kernels
from verl_tlt.modeling.linear_kernels import KERNELS
from verl_tlt.modeling.model import CausalLM

# CPU weight layouts keep up to two extra copies of each linear weight; by default only models up to this size use
# them.
CPU_LAYOUTS_MAX_BYTES = 1 << 30
CPU_KERNEL_MODES = ("measure", "thresholds", *KERNELS)


def setup_cpu_kernels(model: CausalLM, cpu_layouts: bool | None, cpu_kernels: str) -> KernelPlan | None:
    """Apply the layout and kernel settings to `model`; returns the kernel plan (None without layouts or with the
    thresholds)."""
    if cpu_kernels not in CPU_KERNEL_MODES:
        raise ValueError(f"cpu_kernels must be one of {', '.join(CPU_KERNEL_MODES)}, got {cpu_kernels!r}")
    param = next(model.parameters())
    on_cpu = param.device.type == "cpu"
    if cpu_layouts is None:  # auto: CPU models in a dtype the kernels serve, when the extra copies stay small
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        dtypes = (torch.float32,) if cpu_kernels == "thresholds" else (torch.float32, torch.bfloat16)
        cpu_layouts = on_cpu and param.dtype in dtypes and weight_bytes <= CPU_LAYOUTS_MAX_BYTES
    model.use_cpu_layouts(cpu_layouts)
    if not cpu_layouts or not on_cpu or cpu_kernels == "thresholds":
        return None
    if cpu_kernels == "measure":
        return plan_kernels(model)
    return force_kernel(model, cpu_kernels)
