"""Where verl's checkpoints of a run live, as verl itself resolves them, for TLT's files beside them."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def checkpoint_root(config: Any) -> Path:
    """``trainer.default_local_dir``, absolute: verl reads a relative one from the working directory."""
    return _absolute(config.trainer.default_local_dir)


def step_folder(config: Any, step: int) -> Path:
    """verl's checkpoint folder of ``step``."""
    return checkpoint_root(config) / f"global_step_{step}"


def resumed_folder(config: Any, step: int) -> Path:
    """The folder verl's ``_load_checkpoint`` resumed ``step`` from (``trainer.resume_mode`` auto or resume_path)."""
    if config.trainer.resume_mode == "resume_path":
        return _absolute(config.trainer.resume_from_path)
    return step_folder(config, step)


def _absolute(folder: str) -> Path:
    path = Path(folder)
    return path if path.is_absolute() else Path.cwd() / path
