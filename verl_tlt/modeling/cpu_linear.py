"""nn.Linear whose CPU inference forwards run from weight copies laid out for the fastest kernel at that size.

Which kernel runs is decided per layer and row count: by measurement on this host when the engine planned the
model's kernels (`kernel_plan.plan_kernels`, what `RolloutEngine` does by default; `linear_kernels` has the
candidates), else by the size thresholds below, measured on one AMD EPYC host (the fallback, and what
`cpu_kernels="thresholds"` keeps).

Why: in fp32 on CPU, `nn.Linear` goes to the BLAS GEMM (MKL in the stock wheels), and two other kernels beat it
by shape on some processors (measure with `verl-tlt bench engine`):
- a product with a large weight goes faster through oneDNN with the weight pre-packed into its blocked layout
  (the route torch.compile's CPU backend and IPEX take): up to 4.5x on an AMD EPYC (AVX-512), where MKL does not
  use its fastest kernels;
- a matrix-vector product (at most SMALL_BATCH_ROWS rows) with a small weight goes faster as `x @ W^T` against a
  transposed contiguous copy than through the GEMM call.
Everything else stays on `nn.Linear`.

oneDNN compiles a kernel for every new row count it sees (~0.4 ms each on that machine), and a rollout's row
counts change every step; so packed products run on a few padded row counts (`packed_rows`: at most 25% padding,
four sizes per doubling), and each kernel is compiled once per process.

The copies are derived from the parameter, never trained through, and rebuilt after every weight change (the
parameter's version counter, or `invalidate()` for writes through `.data`, which is how the engine loads weights).
Parameters and names are nn.Linear's, so checkpoints and weight syncs are unaffected.
"""

from __future__ import annotations

import itertools
import weakref

import torch
from torch import nn

from verl_tlt.modeling.linear_kernels import (
    COPY_KERNELS,
    DEFAULT_KERNEL,
    apply_kernel,
    bucket_of,
    disable_packed_kernel,
    packed_kernel_available,
    serves,
    weight_layout,
)

# Up to this many rows, a small product may use the transposed copy.
SMALL_BATCH_ROWS = 4
# The oneDNN packed kernel serves products of at least this many multiply-adds (rows x in x out) with weights of at
# least this many elements. Below, its ~12 us fixed cost per call outweighs the gain: in isolation 0.26M MACs ran
# faster unpacked and 0.84M+ faster packed, but in engine runs on the toy model (weights <= 128 x 1024, cache-resident)
# the packed kernel made speculative steps 10-20% slower, while the 50M model (512-wide) gained 1.6-4.5x per product.
PACKED_MIN_MACS = 600_000
PACKED_MIN_WEIGHT = 1 << 18

# Under torch.compile, linears with large weights run through an opaque custom op (`cpu_layout_linear`) that looks
# its module up here, so that the compiled step keeps the oneDNN layouts: inductor's own CPU matmul is the BLAS GEMM,
# which on the AMD dev machine made a compiled 50M model 2x slower than the eager engine. Modules get their key from
# `register_for_compile` (called before compiling), not at construction: copies (deepcopy, unpickling) skip
# __init__ and would otherwise share their original's key, and so its weights.
_MODULES: weakref.WeakValueDictionary[int, CpuLayoutLinear] = weakref.WeakValueDictionary()
_module_keys = itertools.count()


class CpuLayoutLinear(nn.Linear):
    """nn.Linear with optional CPU inference layouts (off until `cpu_layouts` is set; see the module docstring)."""

    cpu_layouts = False
    kernel_choices: dict[int, str] | None = None  # row bucket -> kernel, from a kernel plan; None: the thresholds
    _key: int | None = None  # this module's key in _MODULES, set by register_for_compile
    _key_owner: int | None = None  # id() of the module the key was issued to (a copy carries its original's)
    _compiled_via_op = False  # set by register_for_compile: a large weight whose packed kernel runs on this host

    def invalidate(self) -> None:  # one attribute per kernel in COPY_KERNELS
        self._by_column = None
        self._packed = None

    def set_kernel_choices(self, choices: dict[int, str] | None) -> None:
        """The kernel per row bucket (`linear_kernels.bucket_of`), measured by a kernel plan; None: thresholds."""
        self.kernel_choices = None if choices is None else dict(choices)
        self.invalidate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The copies are detached, and may be inference tensors (built under inference_mode): a forward that autograd
        # records (training this layer, or anything upstream of it, such as a drafter through a frozen shared head)
        # runs on the parameter.
        trains = torch.is_grad_enabled()
        # Thresholds were measured in fp32 only; a measured plan covers whatever dtype it was measured in.
        dtype_ok = self.weight.dtype == torch.float32 or self.kernel_choices is not None
        if not self.cpu_layouts or trains or x.device.type != "cpu" or not dtype_ok:
            return super().forward(x)
        if torch.compiler.is_compiling():
            # Large weights: the layouts' kernels, opaque to the compiler. Small ones: traced as a plain product, where
            # inductor's own kernel is as fast and the step's elementwise work fuses around it.
            registered = self._key is not None and self._key_owner == id(self)  # plain attributes: traceable
            if registered and self._compiled_via_op:
                return torch.ops.verl_tlt.cpu_layout_linear(x, self._key)
            return super().forward(x)
        return self._layout_forward(x)

    def _layout_forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        kernel = self._kernel_for(rows)
        if kernel == DEFAULT_KERNEL:
            return super().forward(x)
        try:
            layout = self._layout(f"_{kernel}", lambda w: weight_layout(kernel, w)) if kernel in COPY_KERNELS else None
            out = apply_kernel(kernel, x.reshape(rows, self.in_features), self.weight, layout, self.bias)
        except RuntimeError as error:  # a torch build whose oneDNN ops refuse: nn.Linear from now on
            if kernel != "packed":
                raise
            disable_packed_kernel(error, self.weight.dtype)
            return super().forward(x)
        return out.view(*x.shape[:-1], self.out_features)

    def _kernel_for(self, rows: int) -> str:
        if self.kernel_choices is not None:
            kernel = self.kernel_choices[bucket_of(rows)]
            usable = serves(kernel, rows) and (kernel != "packed" or packed_kernel_available(self.weight.dtype))
            return kernel if usable else DEFAULT_KERNEL
        weight_size = self.in_features * self.out_features
        if (
            weight_size >= PACKED_MIN_WEIGHT
            and rows * weight_size >= PACKED_MIN_MACS
            and packed_kernel_available(self.weight.dtype)
        ):
            return "packed"
        return "by_column" if rows <= SMALL_BATCH_ROWS else DEFAULT_KERNEL

    def _layout(self, name: str, build) -> torch.Tensor:
        # In-place updates of the parameter itself (optimizer steps, load_state_dict) bump its version; writes through
        # `.data` views (the engine's weight loads) do not, so those call invalidate() explicitly.
        version = self.weight._version
        cached = getattr(self, name, None)
        if cached is None or cached[0] != version:
            cached = (version, build(self.weight.detach()))
            setattr(self, name, cached)
        return cached[1]


@torch.library.custom_op("verl_tlt::cpu_layout_linear", mutates_args=())
def cpu_layout_linear(x: torch.Tensor, module_key: int) -> torch.Tensor:
    """The CpuLayoutLinear registered under `module_key`, applied eagerly (its kernel choice included) to `x`."""
    return _MODULES[module_key]._layout_forward(x)


@cpu_layout_linear.register_fake
def _(x: torch.Tensor, module_key: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], _MODULES[module_key].out_features))


def register_for_compile(module: nn.Module) -> None:
    """Give every CpuLayoutLinear under `module` its own key, so that compiled code can reach its layouts."""
    for child in module.modules():
        if isinstance(child, CpuLayoutLinear) and (child._key is None or _MODULES.get(child._key) is not child):
            child._key, child._key_owner = next(_module_keys), id(child)
            _MODULES[child._key] = child
        if isinstance(child, CpuLayoutLinear):
            # Decided here, outside the traced code (the probe and the switch are not for dynamo to trace); without
            # the packed kernel, inductor's product is as fast as the layouts' BLAS kernels, so it is traced.
            large = child.in_features * child.out_features >= PACKED_MIN_WEIGHT
            child._compiled_via_op = large and packed_kernel_available(child.weight.dtype)


def set_cpu_layouts(module: nn.Module, enabled: bool) -> None:
    """Turn the CPU inference layouts of every CpuLayoutLinear under `module` on or off (dropping old copies)."""
    for child in module.modules():
        if isinstance(child, CpuLayoutLinear):
            child.cpu_layouts = enabled
            child.invalidate()


def invalidate_cpu_layouts(module: nn.Module) -> None:
    """Forget every weight copy under `module` (after writing weights through `.data`)."""
    for child in module.modules():
        if isinstance(child, CpuLayoutLinear):
            child.invalidate()
