"""The CPU kernels a linear layer's inference product can run in, and choosing among them by measurement.

Candidates (each gives the same product, up to float rounding):
- `linear`: `nn.functional.linear`, the BLAS GEMM of the torch build (MKL in the stock x86 wheels); the default.
- `by_column`: `x @ W^T` against a transposed contiguous copy of the weight: no GEMM call set-up, which pays for
  matrix-vector products of small weights.
- `packed`: oneDNN's product with the weight pre-packed into its blocked layout (the route torch.compile's CPU
  backend and IPEX take); rows are padded to a few sizes (`packed_rows`) because oneDNN compiles a kernel per row
  count.
- `matrix_vector`: a single row only (batch-1 decode), as `torch.mv` / `torch.addmv` on the parameter itself: the
  BLAS matrix-vector routine instead of a one-row GEMM. On an Intel Xeon (AMX) it read the weights 15-30% faster
  than `linear` in fp32 and bf16 alike, and batch-1 decode is nothing but reading the weights. No copy.

Which is fastest depends on the processor, the shape and the row count: on an AMD EPYC (AVX-512) `packed` was up to
4.5x faster than MKL for large weights, while on an Intel Xeon (AMX) it made the 50M model's batch-1 decode 1.46x
slower than MKL. So instead of thresholds tuned on one host, `measure_kernels` times each candidate on the layer's
own shape at the row counts a rollout uses (`ROW_BUCKETS`: decode batches and verify widths) and `choose_kernel`
keeps a non-default kernel only where it is clearly faster. `kernel_plan.py` caches the choices per host and shape.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

DEFAULT_KERNEL = "linear"
KERNELS = ("linear", "by_column", "packed", "matrix_vector")
# Kernels that serve only products of this many rows (other row counts run the default).
SINGLE_ROW_KERNELS = frozenset({"matrix_vector"})
# Row counts measured; a product of r rows takes the choice of the smallest bucket >= r (the largest beyond).
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# A non-default kernel must be this much faster than the default to be chosen: a shared VM's timing noise is a few
# percent, and keeping the default where it makes no difference keeps no weight copy.
MIN_GAIN = 0.05
# Measured products cycle through copies of the weight adding up to `cold_bytes`: by default this many bytes, and for
# a model (kernel_plan) its own weight bytes, capped at MAX_COLD_BYTES. At most MAX_COPIES copies.
COLD_BYTES = 64 << 20
MAX_COLD_BYTES = 256 << 20
MAX_COPIES = 256

_packed_usable: bool | None = None  # decided on first use: this torch build may lack the oneDNN ops


def packed_kernel_available() -> bool:
    global _packed_usable
    if _packed_usable is None:
        ops = getattr(torch.ops, "mkldnn", None)
        _packed_usable = bool(
            torch.backends.mkldnn.is_available()
            and ops is not None
            and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")
        )
    return _packed_usable


def disable_packed_kernel() -> None:
    """This build's oneDNN ops refused a call: never offer `packed` again in this process."""
    global _packed_usable
    _packed_usable = False


def available_kernels() -> tuple[str, ...]:
    return KERNELS if packed_kernel_available() else tuple(k for k in KERNELS if k != "packed")


def bucket_of(rows: int) -> int:
    """The measured row count whose choice a product of `rows` rows takes."""
    for bucket in ROW_BUCKETS:
        if rows <= bucket:
            return bucket
    return ROW_BUCKETS[-1]


def packed_rows(rows: int) -> int:
    """The row count a packed product of `rows` rows runs at: 8 below 8, else rounded up to a quarter-octave step."""
    if rows <= 8:
        return 8
    step = 1 << (rows.bit_length() - 3)  # 9-16 rows: steps of 2; 17-32: of 4; ...
    return -(-rows // step) * step


def serves(kernel: str, rows: int) -> bool:
    """Whether `kernel` can compute a product of `rows` rows."""
    return rows == 1 or kernel not in SINGLE_ROW_KERNELS


def weight_layout(kernel: str, weight: torch.Tensor) -> torch.Tensor | None:
    """The weight copy `kernel` runs from (None: the parameter itself)."""
    if kernel == "by_column":
        return weight.t().contiguous()
    if kernel == "packed":
        return torch.ops.mkldnn._reorder_linear_weight(weight, None)
    if kernel in (DEFAULT_KERNEL, "matrix_vector"):
        return None
    raise ValueError(f"unknown linear kernel {kernel!r}; choose from {', '.join(KERNELS)}")


def apply_kernel(
    kernel: str, flat: torch.Tensor, weight: torch.Tensor, layout: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """`flat` (rows x in) times the weight by `kernel`, from its `layout` copy (`weight_layout`)."""
    if kernel == "by_column":
        out = flat @ layout
        return out + bias if bias is not None else out
    if kernel == "packed":
        rows = flat.shape[0]
        padded = packed_rows(rows)
        if padded != rows:
            flat = torch.nn.functional.pad(flat, (0, 0, 0, padded - rows))
        return torch.ops.mkldnn._linear_pointwise(flat, layout, bias, "none", [], "")[:rows]
    if kernel == "matrix_vector":
        if flat.shape[0] != 1:
            raise ValueError(f"the matrix_vector kernel computes one row, got {flat.shape[0]}")
        vector = flat[0]
        out = torch.mv(weight, vector) if bias is None else torch.addmv(bias, weight, vector)
        return out.unsqueeze(0)
    return torch.nn.functional.linear(flat, weight, bias)


def measure_kernels(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    rows: Sequence[int] = ROW_BUCKETS,
    kernels: Sequence[str] | None = None,
    budget_s: float = 0.02,
    clock: Callable[[], float] = time.perf_counter,
    cold_bytes: int = COLD_BYTES,
) -> dict[int, dict[str, float]]:
    """Seconds per product of each kernel at each row count (median of timed calls, after a warm-up call that also
    compiles oneDNN's kernel for that row count), about `budget_s` of calls per cell.

    In a model every layer's weight comes from memory, not from a cache that the same product warmed a moment ago;
    so the calls cycle through copies of the weight adding up to `cold_bytes`, the distance at which the model reuses
    a weight (its weight bytes): a weight that a model's step evicts from the caches (480 MB of L3 on one Intel Xeon
    VM) is measured cold, and a small model's weights, which stay in the caches, are measured hot."""
    kernels = tuple(kernels or available_kernels())
    copies = max(1, min(MAX_COPIES, -(-min(cold_bytes, MAX_COLD_BYTES) // (weight.numel() * weight.element_size()))))
    weights = [weight] + [weight.clone() for _ in range(copies - 1)]  # same values: no denormal surprises
    layouts = {kernel: [weight_layout(kernel, w) for w in weights] for kernel in kernels}
    timings: dict[int, dict[str, float]] = {}
    with torch.inference_mode():
        for kernel in kernels:  # every copy's pages touched once
            for i in range(copies):
                apply_kernel(
                    kernel, torch.zeros(1, weight.shape[1], dtype=weight.dtype), weights[i], layouts[kernel][i], bias
                )
        for count in rows:
            x = torch.randn(count, weight.shape[1], dtype=weight.dtype)
            cell = {}
            for kernel in (k for k in kernels if serves(k, count)):

                def call(i: int, kernel: str = kernel, x: torch.Tensor = x) -> None:
                    apply_kernel(kernel, x, weights[i % copies], layouts[kernel][i % copies], bias)

                call(0)  # warm-up (oneDNN compiles a kernel per row count)
                start = clock()
                call(1)
                once = max(clock() - start, 1e-7)
                samples = []
                for i in range(max(5, min(40, int(budget_s / once)))):
                    start = clock()
                    call(i + 2)
                    samples.append(clock() - start)
                cell[kernel] = statistics.median(samples)
            timings[count] = cell
    return timings


def choose_kernel(cell: dict[str, float], min_gain: float = MIN_GAIN) -> str:
    """The fastest kernel of one measured cell; the default unless another is faster by more than `min_gain`."""
    fastest = min(cell, key=cell.get)
    if DEFAULT_KERNEL in cell and cell[fastest] > cell[DEFAULT_KERNEL] * (1 - min_gain):
        return DEFAULT_KERNEL
    return fastest
