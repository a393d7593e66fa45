"""Which kernel each linear layer of a model runs at each row count, measured once per host and shape.

`plan_kernels(model)` finds the distinct shapes of the model's `CpuLayoutLinear` layers, takes each shape's choices
from the cache (`<cache root>/kernels/<host>.json`, keyed by processor, torch version, thread count and dtype, so
another machine or setting measures afresh) or measures them (`linear_kernels.choose_kernels`: passes over the
model's layers per candidate and row count, a few seconds for a 50M model on 2 cores), and gives every layer its
shape's choices. A second engine start on the same host costs a file read. `force_kernel(model, name)` gives every
layer one kernel instead (tests, and to compare).
"""

from __future__ import annotations

import json
import logging
import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from verl_tlt.files import atomic_write_text, default_cache_root, exclusive_lock
from verl_tlt.modeling.cpu_linear import CpuLayoutLinear
from verl_tlt.modeling.linear_kernels import (
    DEFAULT_KERNEL,
    NO_PACKED_ENV,
    ROW_BUCKETS,
    available_kernels,
    choose_kernels,
    disable_packed_kernel,
    kernels_for_all,
    packed_disabled_by_env,
)

logger = logging.getLogger(__name__)

# Bump when the candidates or the measurement change: old cache entries are then ignored.
# 2: matrix_vector added; shapes measured in passes over the model.
PLAN_VERSION = 2


@dataclass
class KernelPlan:
    """Per shape ('in x out, dtype'): the kernel at each row bucket; where the choices came from, and what it cost."""

    host: str
    choices: dict[str, dict[int, str]] = field(default_factory=dict)
    measured_shapes: int = 0  # shapes measured now (the rest came from the cache)
    measure_s: float = 0.0
    forced: str | None = None

    def summary(self) -> dict:
        """What the engine's stats and the benchmark JSON record: the host, and each shape's non-default choices."""
        return {
            "host": self.host,
            "forced": self.forced,
            "measured_shapes": self.measured_shapes,
            "cached_shapes": len(self.choices) - self.measured_shapes,
            "measure_s": round(self.measure_s, 2),
            "kernels": {
                shape: {str(rows): by_rows[rows] for rows in sorted(by_rows) if by_rows[rows] != DEFAULT_KERNEL}
                for shape, by_rows in self.choices.items()
            },
        }

    def describe(self) -> str:
        """One line for a log: where the choices came from and how many are not the default."""
        if self.forced is not None:
            return f"{self.forced} forced"
        picks = [kernel for by_rows in self.choices.values() for kernel in by_rows.values()]
        others = sorted({kernel for kernel in picks if kernel != DEFAULT_KERNEL})
        return (
            f"{len(self.choices)} shapes ({self.measured_shapes} measured in {self.measure_s:.1f} s, the rest "
            f"cached) on {self.host}; {sum(k != DEFAULT_KERNEL for k in picks)} of {len(picks)} shape x row-count "
            f"choices not {DEFAULT_KERNEL!r}" + (f" ({', '.join(others)})" if others else "")
        )


def host_processor() -> str:
    """The CPU's model name (/proc/cpuinfo; `platform.processor()` is often just the architecture on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_key() -> str:
    """What a kernel's speed depends on besides the shape: processor, torch build, threads, and whether the packed
    kernel is switched off (NO_PACKED_ENV): plans measured without it are not reused with it, nor the other way."""
    switched_off = f" | {NO_PACKED_ENV}" if packed_disabled_by_env() else ""
    return (
        f"{host_processor()} | torch {torch.__version__} | {torch.get_num_threads()} threads | v{PLAN_VERSION}"
        + switched_off
    )


def plan_kernels(model: nn.Module, cache_dir: str | Path | None = None) -> KernelPlan:
    """Measure (or read from the cache) the best kernel per shape and row bucket, and give it to every layer."""
    layers = [m for m in model.modules() if isinstance(m, CpuLayoutLinear)]
    host = host_key()
    path = Path(cache_dir or default_cache_root() / "kernels") / f"{_file_name(host)}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Every process on the host takes its plan from one measurement: rollout replicas starting together would
        # otherwise each measure, and might choose differently (kernels round differently; runs that must match
        # token for token, such as a baseline and its TLT run, need the same kernels).
        with exclusive_lock(path.with_suffix(".lock")):
            return _plan_under_lock(layers, host, path)
    except OSError as error:  # a read-only cache: measure in this process only, never fail the engine over it
        logger.warning("no kernel-plan cache at %s (%s): measuring for this process only", path, error)
        return _plan_under_lock(layers, host, None)


def _plan_under_lock(layers: list[CpuLayoutLinear], host: str, path: Path | None) -> KernelPlan:
    cached = _read_cache(path, host) if path is not None else {}
    plan = KernelPlan(host)
    started = time.perf_counter()
    missing = sorted({shape_key(layer) for layer in layers} - set(cached))
    if missing:
        # Measured in passes over all the model's layers (the context a forward gives each product); only the shapes
        # not cached yet take the new choices, so a shape keeps one choice on this host whichever model it is in.
        products = [(shape_key(layer), layer.weight.detach(), _bias(layer)) for layer in layers]
        dtypes = {layer.weight.dtype for layer in layers}
        try:
            choices = choose_kernels(products, ROW_BUCKETS, kernels_for_all(dtypes))
        except RuntimeError as error:  # oneDNN refused a shape its probe passed: measure without it
            if "packed" not in kernels_for_all(dtypes):
                raise
            for dtype in dtypes:
                disable_packed_kernel(error, dtype)
            choices = choose_kernels(products, ROW_BUCKETS, kernels_for_all(dtypes))
        for shape in missing:
            cached[shape] = {rows: choices[rows][shape] for rows in ROW_BUCKETS}
        plan.measured_shapes = len(missing)
    for layer in layers:
        shape = shape_key(layer)
        plan.choices[shape] = cached[shape]
        layer.set_kernel_choices(plan.choices[shape])
    plan.measure_s = time.perf_counter() - started
    if plan.measured_shapes:
        if path is not None:
            _write_cache(path, host, cached)
        logger.info(
            "measured CPU linear kernels for %d shape(s) in %.1f s (cache: %s)",
            plan.measured_shapes,
            plan.measure_s,
            path,
        )
    return plan


def force_kernel(model: nn.Module, kernel: str) -> KernelPlan:
    """Every CpuLayoutLinear under `model` runs `kernel` at every row count."""
    usable = kernels_for_all({layer.weight.dtype for layer in model.modules() if isinstance(layer, CpuLayoutLinear)})
    if kernel not in usable:
        raise ValueError(f"CPU linear kernel {kernel!r} is not available here; choose from {usable}")
    plan = KernelPlan(host_key(), forced=kernel)
    for layer in model.modules():
        if isinstance(layer, CpuLayoutLinear):
            plan.choices[shape_key(layer)] = dict.fromkeys(ROW_BUCKETS, kernel)
            layer.set_kernel_choices(plan.choices[shape_key(layer)])
    return plan


def shape_key(layer: nn.Linear) -> str:
    bias = "+bias" if layer.bias is not None else ""
    return f"{layer.in_features}x{layer.out_features}{bias} {str(layer.weight.dtype).removeprefix('torch.')}"


def _bias(layer: nn.Linear) -> torch.Tensor | None:
    return None if layer.bias is None else layer.bias.detach()


def _file_name(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", host).strip("-")[:160]


def _read_cache(path: Path, host: str) -> dict[str, dict[int, str]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if data.get("host") != host:
        return {}
    choices = {}
    for shape, by_rows in data.get("choices", {}).items():
        entry = {int(rows): kernel for rows, kernel in by_rows.items()}
        dtype = getattr(torch, shape.rpartition(" ")[2], None)  # shape_key ends with the dtype
        kernels = set(available_kernels(dtype)) if isinstance(dtype, torch.dtype) else set()
        if set(entry) == set(ROW_BUCKETS) and set(entry.values()) <= kernels:
            choices[shape] = entry
    return choices


def _write_cache(path: Path, host: str, choices: dict[str, dict[int, str]]) -> None:
    try:
        payload = {"host": host, "choices": {s: {str(r): k for r, k in c.items()} for s, c in choices.items()}}
        atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    except OSError as error:  # a read-only home: measure again next time, never fail the engine over it
        logger.warning("could not cache the CPU kernel plan in %s: %s", path, error)
