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

import torch

from verl_tlt.drafter.data import DrafterSample

STEP_FILE = "step_{step:05d}.pt"
_STEP_PATTERN = re.compile(r"step_(\d+)\.pt$")


@dataclass
class RecordedStep:
    """One RL step: its captured samples, and the policy's shared weights of its rollout (None = the initial
    target's, i.e. the run's `model.path`)."""

    step: int
    samples: list[DrafterSample]
    shared_weights: dict[str, torch.Tensor] | None


def save_step(directory: str | Path, record: RecordedStep) -> Path:
    """Write one step's record atomically (a reader never sees half a file); returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / STEP_FILE.format(step=record.step)
    partial = path.with_suffix(".pt.partial")
    samples = [(s.token_ids, s.hidden_states, s.response_mask, s.step) for s in record.samples]
    torch.save({"step": record.step, "samples": samples, "shared_weights": record.shared_weights}, partial)
    partial.replace(path)
    return path


def load_steps(directory: str | Path) -> list[RecordedStep]:
    """Every step recorded in `directory`, in step order."""
    directory = Path(directory)
    paths = sorted(
        (int(match.group(1)), path)
        for path in directory.glob("step_*.pt")
        if (match := _STEP_PATTERN.search(path.name))
    )
    if not paths:
        raise FileNotFoundError(
            f"No recorded steps (step_NNNNN.pt) in {directory}; record a run with tlt.drafter.record_dir={directory}"
        )
    steps = []
    for _, path in paths:
        try:
            data = torch.load(path, map_location="cpu", weights_only=False)
            samples = [DrafterSample(*fields) for fields in data["samples"]]
        except Exception as error:  # truncated, or not a recording at all
            raise ValueError(f"Cannot read the drafter recording {path}: {error}") from error
        steps.append(RecordedStep(int(data["step"]), samples, data["shared_weights"]))
    return steps
