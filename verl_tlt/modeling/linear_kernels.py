"""The CPU kernels a linear layer's inference product can run in, and choosing among them by measurement.

Candidates (each gives the same product, up to float rounding):
- `linear`: `nn.functional.linear`, the BLAS GEMM of the torch build (MKL in the stock x86 wheels); the default.
- `by_column`: `x @ W^T` against a transposed contiguous copy of the weight: no GEMM call set-up, which pays for
  matrix-vector products of small weights.
- `packed`: oneDNN's product with the weight pre-packed into its blocked layout (the route torch.compile's CPU
  backend and IPEX take); rows are padded to a few sizes (`packed_rows`) because oneDNN compiles a kernel per row
  count.
- `matrix_vector`: a single row only (batch-1 decode), as `torch.mv` / `torch.addmv` on the parameter itself: the
  BLAS matrix-vector routine instead of a one-row GEMM. No copy. On an Intel Xeon (AMX) it made the bf16 batch-1
  decode of a 50M model faster than `linear`; in fp32 it was slower there than `linear` and `by_column`.

Which is fastest depends on the processor, the shape and the row count: on an AMD EPYC (AVX-512) `packed` was up to
4.5x faster than MKL for large weights, while on an Intel Xeon (AMX) it made the 50M model's batch-1 decode 1.46x
slower than MKL. So instead of thresholds tuned on one host, `choose_kernels` times the candidates on the model's
own layers, in passes over them in forward order, at the row counts a rollout uses (`ROW_BUCKETS`: decode batches
and verify widths), and keeps a non-default kernel only where it is clearly faster.
`kernel_plan.py` caches the choices per host and shape.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence

import torch

logger = logging.getLogger(__name__)

DEFAULT_KERNEL = "linear"
KERNELS = ("linear", "by_column", "packed", "matrix_vector")
# Kernels that serve only products of this many rows (other row counts run the default).
SINGLE_ROW_KERNELS = frozenset({"matrix_vector"})
# Kernels that run from a copy of the weight (`weight_layout`); the others use the parameter itself.
COPY_KERNELS = ("by_column", "packed")
# Row counts measured; a product of r rows takes the choice of the smallest bucket >= r (the largest beyond).
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# A non-default kernel must be this much faster than the default to be chosen: a shared VM's timing noise is a few
# percent, and keeping the default where it makes no difference keeps no weight copy.
MIN_GAIN = 0.05
# Timed passes over the model per kernel and row count (choose_kernels): at least this many, at most that many.
MIN_PASSES = 3
MAX_PASSES = 9

# Set to 1 to run as a host without the oneDNN packed kernel would (an AVX2-only processor refuses it in bf16, some
# torch builds lack it altogether): the other kernels then serve every product, so that path is tested on any host.
NO_PACKED_ENV = "VERL_TLT_NO_PACKED_KERNEL"

# dtype -> whether oneDNN's packed product runs here, decided on first use by a real call (`_probe_packed`): the ops
# can exist and still refuse a dtype (bf16 needs AVX-512 or AVX-NE-CONVERT), and a refusal in one dtype says nothing
# of another.
_packed_usable: dict[torch.dtype, bool] = {}


def packed_disabled_by_env() -> bool:
    return os.environ.get(NO_PACKED_ENV, "") not in ("", "0")


def packed_kernel_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether the `packed` kernel serves products in `dtype` on this host (False everywhere under NO_PACKED_ENV)."""
    if packed_disabled_by_env():
        return False
    if dtype not in _packed_usable:
        _packed_usable[dtype] = _probe_packed(dtype)
    return _packed_usable[dtype]


def _probe_packed(dtype: torch.dtype) -> bool:
    ops = getattr(torch.ops, "mkldnn", None)
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")):
        logger.info("this torch build has no oneDNN packed linear; other kernels serve its products")
        return False
    weight = torch.ones(16, 16, dtype=dtype)
    try:
        with torch.inference_mode():
            layout = ops._reorder_linear_weight(weight, None)
            ops._linear_pointwise(torch.ones(8, 16, dtype=dtype), layout, None, "none", [], "")
    except RuntimeError as error:
        logger.info("oneDNN packed linear refuses %s here (%s); other kernels serve its products", dtype, error)
        return False
    return True


def disable_packed_kernel(error: Exception, dtype: torch.dtype) -> None:
    """This build's oneDNN ops refused a call in `dtype` (`error`): never offer `packed` for it again here."""
    _packed_usable[dtype] = False
    logger.warning("oneDNN packed linear unavailable for %s (%s); other kernels serve its products", dtype, error)


def available_kernels(dtype: torch.dtype = torch.float32) -> tuple[str, ...]:
    """The candidates for products in `dtype` on this host."""
    return KERNELS if packed_kernel_available(dtype) else tuple(k for k in KERNELS if k != "packed")


def kernels_for_all(dtypes: set[torch.dtype] | frozenset[torch.dtype]) -> tuple[str, ...]:
    """The candidates that serve products in every one of `dtypes` (a model's layers, usually one dtype)."""
    usable = [available_kernels(dtype) for dtype in dtypes] or [available_kernels()]
    return tuple(kernel for kernel in KERNELS if all(kernel in kernels for kernels in usable))


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
    if kernel in KERNELS:
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


Product = tuple[str, torch.Tensor, torch.Tensor | None]  # (shape key, weight, bias) of one layer


def choose_kernels(
    products: Sequence[Product],
    rows: Sequence[int] = ROW_BUCKETS,
    kernels: Sequence[str] | None = None,
    budget_s: float = 0.05,
    clock: Callable[[], float] = time.perf_counter,
    min_gain: float = MIN_GAIN,
) -> dict[int, dict[str, str]]:
    """The kernel of each shape at each row count, `choices[rows][key]`, measured in passes over a model.

    `products` are the model's linear layers (key, weight, bias) in the order a forward runs them; the key names the
    shape, shared by the layers of one shape. At each row count:
    1. a pass per candidate kernel (every layer in that kernel) gives each shape's time in it, summed over its
       layers, and each shape takes the fastest (`choose_kernel`: the default unless another is clearly faster);
    2. when that mixes kernels, a pass of the mixture is timed too, and it is kept only if it beats the fastest
       single kernel by more than `min_gain`; otherwise every shape takes that kernel.

    Why passes in forward order, not one weight timed in a loop: in a forward a weight is read again only after
    every other one, between products of other shapes, so a kernel is measured with the caches in the state a
    forward leaves them. Timed one weight at a time (even cycling through copies as large as the model) the
    candidates ranked differently on an Intel Xeon VM with 480 MB of L3: `matrix_vector` came first for three of
    the 50M model's shapes at batch 1, and in the model it was slower there than `linear` and `by_column`.
    Why step 2: switching between libraries' kernels costs time of its own. There, bf16 `packed` for three shapes
    and `matrix_vector` for two, each shape's fastest, ran a pass slower than either kernel for all five.
    """
    kernels = tuple(kernels or kernels_for_all({weight.dtype for _, weight, _ in products}))
    layouts = {kernel: [weight_layout(kernel, weight) for _, weight, _ in products] for kernel in kernels}
    choices: dict[int, dict[str, str]] = {}
    with torch.inference_mode():
        for count in rows:
            inputs: dict[tuple[int, torch.dtype], torch.Tensor] = {}
            for _, weight, _ in products:
                if (weight.shape[1], weight.dtype) not in inputs:
                    inputs[weight.shape[1], weight.dtype] = torch.randn(count, weight.shape[1], dtype=weight.dtype)

            def timed(assignment: Sequence[str], inputs: dict = inputs) -> tuple[dict[str, float], float]:
                return _time_passes(products, assignment, layouts, inputs, budget_s, clock)

            candidates = [kernel for kernel in kernels if serves(kernel, count)]
            uniform = {kernel: timed([kernel] * len(products)) for kernel in candidates}
            by_key = {
                key: choose_kernel({k: uniform[k][0][key] for k in candidates}, min_gain) for key, _, _ in products
            }
            single = choose_kernel({kernel: total for kernel, (_, total) in uniform.items()}, min_gain)
            if len(set(by_key.values())) > 1:
                _, mixed_total = timed([by_key[key] for key, _, _ in products])
                if mixed_total >= uniform[single][1] * (1 - min_gain):
                    by_key = dict.fromkeys(by_key, single)
            choices[count] = by_key
    return choices


def _time_passes(
    products: Sequence[Product],
    assignment: Sequence[str],
    layouts: dict[str, list[torch.Tensor | None]],
    inputs: dict[tuple[int, torch.dtype], torch.Tensor],
    budget_s: float,
    clock: Callable[[], float],
) -> tuple[dict[str, float], float]:
    """Median seconds per pass of each key's products, and of a whole pass, products[i] run in assignment[i]: at
    least MIN_PASSES timed passes, more while they fit in about `budget_s`, after a warm-up pass (which also
    compiles oneDNN's kernel for the row count)."""

    def one_pass() -> dict[str, float]:
        seconds: dict[str, float] = {}
        for index, ((key, weight, bias), kernel) in enumerate(zip(products, assignment, strict=True)):
            x = inputs[weight.shape[1], weight.dtype]
            start = clock()
            apply_kernel(kernel, x, weight, layouts[kernel][index], bias)
            seconds[key] = seconds.get(key, 0.0) + clock() - start
        return seconds

    one_pass()
    passes = [one_pass()]
    per_pass = max(sum(passes[0].values()), 1e-7)
    passes += [one_pass() for _ in range(max(MIN_PASSES, min(MAX_PASSES, int(budget_s / per_pass))) - 1)]
    by_key = {key: statistics.median(p[key] for p in passes) for key in passes[0]}
    return by_key, statistics.median(sum(p.values()) for p in passes)


def choose_kernel(cell: dict[str, float], min_gain: float = MIN_GAIN) -> str:
    """The fastest kernel of one measured cell; the default unless another is faster by more than `min_gain`."""
    fastest = min(cell, key=cell.get)
    if DEFAULT_KERNEL in cell and cell[fastest] > cell[DEFAULT_KERNEL] * (1 - min_gain):
        return DEFAULT_KERNEL
    return fastest
