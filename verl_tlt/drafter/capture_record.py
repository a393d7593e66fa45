"""Recordings of an RL run's drafter data, for replaying drafter training offline (`verl-tlt bench drafter-replay`).

With `tlt.drafter.record_dir` set, the TLT trainer saves, per RL step, the samples it captured (tokens and the
policy's last-layer hidden states) and the policy's weights that the drafter shares (embedding, LM head) as they
were when that step's rollout was generated. Under keyed sampling with slot-seeded requests a run samples the same
responses whatever its drafter does, so one recording lets many drafter-training recipes be compared on exactly
the data an RL run would give them, in minutes instead of one RL run each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl_tlt.drafter.data import DrafterSample
from verl_tlt.drafter.safe_state import load_state, save_state

# One `safe_state` directory per RL step (JSON + safetensors, written atomically; nothing is unpickled on reading).
STEP_DIR = "step_{step:05d}"
RECORD_KIND = "drafter_capture_step"
_STEP_PATTERN = re.compile(r"step_(\d+)$")
# Recordings of earlier verl_tlt versions (pickles); recognised only to say why they are not read.
_LEGACY_PATTERN = re.compile(r"step_\d+\.pt$")


@dataclass
class RecordedStep:
    """One RL step: its captured samples, and the policy's shared weights of its rollout (None = the initial
    target's, i.e. the run's `model.path`)."""

    step: int
    samples: list[DrafterSample]
    shared_weights: dict[str, torch.Tensor] | None


def save_step(directory: str | Path, record: RecordedStep) -> Path:
    """Write one step's record atomically (a reader never sees half of it); returns its directory."""
    path = Path(directory) / STEP_DIR.format(step=record.step)
    samples = [s.fields() for s in record.samples]
    return save_state(
        path, {"step": record.step, "samples": samples, "shared_weights": record.shared_weights}, kind=RECORD_KIND
    )


def load_steps(directory: str | Path) -> list[RecordedStep]:
    """Every step recorded in `directory`, in step order; ValueError naming the file if one cannot be read."""
    directory = Path(directory)
    paths = sorted(
        (int(match.group(1)), path)
        for path in directory.glob("step_*")
        if path.is_dir() and (match := _STEP_PATTERN.search(path.name))
    )
    if not paths:
        legacy = [path.name for path in directory.glob("step_*.pt") if _LEGACY_PATTERN.search(path.name)]
        hint = (
            f" ({len(legacy)} step_NNNNN.pt files there are recordings of an earlier verl_tlt in a pickle format, "
            "which is not read since unpickling can run arbitrary code)"
            if legacy
            else ""
        )
        raise FileNotFoundError(
            f"No recorded steps (step_NNNNN) in {directory}{hint}; record a run with tlt.drafter.record_dir={directory}"
        )
    return [_read_step(path) for _, path in paths]


def _read_step(path: Path) -> RecordedStep:
    try:
        data = load_state(path, kind=RECORD_KIND)
        return RecordedStep(_checked_int(data.get("step"), "step"), _samples(data.get("samples")), _weights(data))
    except (OSError, ValueError, TypeError, AttributeError) as error:  # truncated, edited, or not a recording
        raise ValueError(f"Cannot read the drafter recording {path}: {error}") from error


def _samples(entries: Any) -> list[DrafterSample]:
    if not isinstance(entries, list):
        raise ValueError(f"samples must be a list, found {type(entries).__name__}")
    return [DrafterSample.from_fields(fields, f"samples/{i}") for i, fields in enumerate(entries)]


def _weights(data: dict) -> dict[str, torch.Tensor] | None:
    weights = data.get("shared_weights")
    if weights is not None and not (
        isinstance(weights, dict) and all(isinstance(v, torch.Tensor) for v in weights.values())
    ):
        raise ValueError("shared_weights must be null or a mapping of names to tensors")
    return weights


def _checked_int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{where} must be an integer, found {value!r}")
    return value
