"""Where and on what code a benchmark ran: recorded beside its numbers, since rates only compare within one host."""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from verl_tlt.modeling.kernel_plan import host_processor


def host_info() -> dict:
    """Where and on what code the numbers were measured."""
    return {
        "processor": host_processor(),
        "bf16_instructions": bf16_instructions(),
        "torch_threads": torch.get_num_threads(),
        "commit": git_commit(),
    }


def bf16_instructions() -> list[str]:
    """The processor's bf16 instruction sets (/proc/cpuinfo flags): where bf16 products have a fast path."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return sorted(flag for flag in set(flags) if flag in ("avx512_bf16", "amx_bf16", "avx_ne_convert"))


def device_info(device: torch.device) -> dict:
    """The device the numbers were measured on: its kind, its name (the GPU's, or the CPU's model) and torch's build."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else host_processor()
    return {"device": device.type, "device_name": name, "torch_version": torch.__version__, "cuda": torch.version.cuda}


def git_commit() -> str | None:
    """The checkout's commit (short), or None outside a git checkout."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def memory_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """The host's weight-streaming bandwidth (bytes/s) as torch sees it: the best of `repeats` matrix-vector products
    with a `megabytes` fp32 matrix (larger than the caches), on torch's threads: a batch-1 decode step is such
    products over every weight, so weight bytes / this is its floor, unless the weights fit in the caches."""
    import time

    matrix = torch.ones(megabytes * (1 << 20) // (4 * 4096), 4096)
    vector = torch.ones(1, 4096)
    vector @ matrix.t()  # pages touched
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        vector @ matrix.t()
        best = min(best, time.perf_counter() - start)
    return matrix.numel() * 4 / best
