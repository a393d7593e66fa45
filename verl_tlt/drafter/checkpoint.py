"""The drafter trainer's checkpoint directory: its format, where to find it after a crash, and checks on reading.

The directory is a `safe_state` one (state.json + tensors.safetensors, never a pickle), written atomically with
`verl_tlt.files.atomic_directory`. A checkpoint is checked against the trainer before any of it is applied, so a
damaged or edited one fails with the entry that is wrong instead of turning into a drafter that fails later.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from verl_tlt.drafter.data import DrafterSample
from verl_tlt.drafter.safe_state import STATE_FILE, load_state, save_state
from verl_tlt.files import previous_directory

logger = logging.getLogger(__name__)

CHECKPOINT_KIND = "drafter_trainer"
# What verl_tlt wrote before checkpoints stopped being pickles; recognised only to say why it is not read.
LEGACY_FILE = "drafter_trainer.pt"


def write_checkpoint(directory: str | Path, state: dict) -> Path:
    """Write a `DrafterTrainer.state_dict()` to `directory`, replacing an earlier checkpoint atomically."""
    return save_state(directory, state, kind=CHECKPOINT_KIND)


def read_checkpoint(directory: str | Path, optimizer: torch.optim.Optimizer) -> tuple[dict, Path]:
    """(state, the directory it came from): `directory`, or the previous checkpoint an interrupted save left aside.

    Raises FileNotFoundError when there is none, ValueError naming the file and the entry when it is unreadable or
    does not fit `optimizer`'s parameters.
    """
    directory = Path(directory)
    kept = previous_directory(directory)
    if not directory.exists() and (kept / STATE_FILE).is_file():
        logger.warning("No drafter checkpoint at %s; continuing from the previous one, %s", directory, kept)
        directory = kept
    if (directory / LEGACY_FILE).is_file() and not (directory / STATE_FILE).is_file():
        raise ValueError(
            f"Cannot load drafter trainer checkpoint {directory}: it holds {LEGACY_FILE}, the pickle format of earlier "
            "verl_tlt versions, which is not read (unpickling can run arbitrary code). Resume with the verl_tlt "
            "version that wrote it, or let the drafter restart from tlt.drafter.init."
        )
    try:
        state = load_state(directory, kind=CHECKPOINT_KIND)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"No drafter trainer checkpoint at {directory}") from error
    try:
        check_state(state, optimizer)
    except ValueError as error:
        raise ValueError(f"Cannot load drafter trainer checkpoint {directory}: {error}") from error
    return state, directory


def check_state(state: Any, optimizer: torch.optim.Optimizer) -> None:
    """Raise ValueError naming the first entry of a trainer state that a trainer with `optimizer` cannot continue from.

    Model tensor names and shapes are left to the model's strict `load_state_dict`.
    """
    _expect(state, dict, "the state")
    for key in ("model", "optimizer", "global_step", "generator", "buffer"):
        if key not in state:
            raise ValueError(f"{STATE_FILE} has no {key!r} entry")
    _expect(state["model"], dict, "model")
    for name, value in state["model"].items():
        _expect(value, torch.Tensor, f"model/{name}")
    _expect_count(state["global_step"], "global_step")
    generator = state["generator"]
    if not isinstance(generator, torch.Tensor) or generator.dtype != torch.uint8 or generator.dim() != 1:
        raise ValueError("generator must be a 1-D uint8 tensor (a torch.Generator state)")
    _check_buffer(state["buffer"])
    _check_optimizer(state["optimizer"], optimizer)


def _check_buffer(buffer: Any) -> None:
    _expect(buffer, dict, "buffer")
    for key in ("next_id", "num_evicted"):
        _expect_count(buffer.get(key), f"buffer/{key}")
    _expect(buffer.get("times_used"), dict, "buffer/times_used")
    for sample_id, count in buffer["times_used"].items():
        _expect_count(sample_id, "buffer/times_used key")
        _expect_count(count, f"buffer/times_used/{sample_id}")
    for sample_id, fields in buffer.get("samples", {}).items():
        _expect_count(sample_id, "buffer/samples key")
        DrafterSample.from_fields(fields, f"buffer/samples/{sample_id}")


def _check_optimizer(saved: Any, optimizer: torch.optim.Optimizer) -> None:
    """Moments must have their parameter's shape: torch's `load_state_dict` takes any, and the next step fails."""
    _expect(saved, dict, "optimizer")
    _expect(saved.get("state"), dict, "optimizer/state")
    _expect(saved.get("param_groups"), list, "optimizer/param_groups")
    ids = []
    for i, group in enumerate(saved["param_groups"]):
        _expect(group, dict, f"optimizer/param_groups/{i}")
        _expect(group.get("params"), list, f"optimizer/param_groups/{i}/params")
        ids += group["params"]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len(ids) != len(params):
        raise ValueError(f"optimizer holds {len(ids)} parameters, this drafter trains {len(params)}")
    shapes = dict(zip(ids, (p.shape for p in params), strict=True))
    for param_id, values in saved["state"].items():
        _expect(values, dict, f"optimizer/state/{param_id}")
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != shapes.get(param_id):
                raise ValueError(
                    f"optimizer/state/{param_id}/{key} has shape {tuple(value.shape)}, its parameter "
                    f"{tuple(shapes[param_id]) if param_id in shapes else '(none)'}"
                )


def _expect(value: Any, kind: type, where: str) -> None:
    if not isinstance(value, kind):
        raise ValueError(f"{where} must be a {kind.__name__}, found {type(value).__name__}")


def _expect_count(value: Any, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{where} must be an integer >= 0, found {value!r}")
