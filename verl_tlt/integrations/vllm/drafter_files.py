"""Moving a drafter between processes as files: an EAGLE-1 export in a node-local directory, replaced atomically.

vLLM's worker processes read a new drafter from disk (``tlt_load_drafter``): no tensors travel through RPC, the
write is one atomic directory swap (a reader sees the previous drafter or the new one), and the same directory is
what ``speculative_config.model`` names at start-up.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from verl_tlt.drafter.export import WEIGHTS_FILE


def drafter_root(replica_rank: int) -> Path:
    """A node-local directory for one replica's drafter versions: /dev/shm where it exists (RAM), else tmp."""
    base = (
        Path("/dev/shm")
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
        else Path(tempfile.gettempdir())
    )
    root = base / f"verl-tlt-{os.getuid()}" / f"vllm-drafter-{os.getpid()}-{replica_rank}"
    root.mkdir(parents=True, exist_ok=True)
    return root


def read_drafter_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of the export at `path`, on CPU."""
    return load_file(str(Path(path) / WEIGHTS_FILE), device="cpu")


def export_drafter_state(state: dict[str, torch.Tensor], hf_config, folder: str | os.PathLike, version: int) -> Path:
    """Write an ``EagleDrafterModel`` state dict (what the drafter trainers publish) as an EAGLE-1 export.

    The state must fit the target described by `hf_config` exactly (strict load), or ValueError says what differs.
    """
    from verl_tlt.drafter.export import export_eagle
    from verl_tlt.drafter.model import EagleDrafterModel
    from verl_tlt.modeling.model import ModelSpec

    model = EagleDrafterModel(ModelSpec.from_hf_config(hf_config))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise ValueError(f"Drafter version {version} does not fit this target's drafter: {error}") from error
    return export_eagle(model, folder, metadata={"version": version})
