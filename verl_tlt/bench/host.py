"""Where and on what code a benchmark ran: recorded beside its numbers, since rates only compare within one host."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch


def host_info() -> dict:
    """Where and on what code the numbers were measured."""
    return {"processor": host_processor(), "torch_threads": torch.get_num_threads(), "commit": git_commit()}


def device_info(device: torch.device) -> dict:
    """The device the numbers were measured on: its kind, its name (the GPU's, or the CPU's model) and torch's build."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else host_processor()
    return {"device": device.type, "device_name": name, "torch_version": torch.__version__, "cuda": torch.version.cuda}


def host_processor() -> str:
    """The CPU's model name (/proc/cpuinfo; `platform.processor()` is often just the architecture on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
