"""Moving a drafter between processes as files: an export in a node-local directory, replaced atomically.

vLLM's worker processes read a new drafter from disk (``tlt_load_drafter``): no tensors travel through RPC, the
write is one atomic directory swap (a reader sees the previous drafter or the new one), and the same directory is
what ``speculative_config.model`` names at start-up.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

from verl_tlt.drafter.export import WEIGHTS_FILE

logger = logging.getLogger(__name__)


# A container's /dev/shm is 64 MiB by default (Docker), far below a 7B target's embedding; below what the exchange
# needs, the replica uses the temporary directory instead (disk-backed, slower, never full of RAM).
SHM = Path("/dev/shm")


def exchange_bytes(hf_config, family: str = "eagle", draft_vocab_size: int = 0) -> int:
    """Bytes one replica's exchange directory holds at most: the policy's embedding and LM head (written for the
    drafter workers' refresh, in the model's dtype) and three drafter exports in fp32 (the start-up drafter, the one
    running and the one being written; an EAGLE-3 export carries its own head too)."""
    from verl_tlt.drafter.eagle3_model import Eagle3DrafterModel, default_aux_layers
    from verl_tlt.drafter.model import EagleDrafterModel
    from verl_tlt.modeling.model import ModelSpec

    spec = ModelSpec.from_hf_config(hf_config)
    dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)  # the latter: old transformers
    width = dtype.itemsize if isinstance(dtype, torch.dtype) else 4
    shared = spec.vocab_size * spec.hidden_size * width * (1 if spec.tie_word_embeddings else 2)
    with torch.device("meta"):
        if family == "eagle3":
            rows = min(draft_vocab_size, spec.vocab_size) or spec.vocab_size
            model = Eagle3DrafterModel(spec, default_aux_layers(spec.num_layers), rows)
        else:
            model = EagleDrafterModel(spec)
        drafter = sum(p.numel() for p in model.parameters())
    return shared + 3 * 4 * drafter


def exchange_base(
    need_bytes: int,
    *,
    shm: Path = SHM,
    fallback: Path | None = None,
    free_bytes: Callable[[Path], int] = lambda path: shutil.disk_usage(path).free,
) -> tuple[Path, str]:
    """Where a replica exchanges drafter files: /dev/shm (RAM) when it is writable and has `need_bytes` free, else
    `fallback` (the temporary directory); and why, for the log."""
    fallback = fallback if fallback is not None else Path(tempfile.gettempdir())
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        return fallback, f"{shm} is not a writable directory"
    free, need = free_bytes(shm) / 2**20, need_bytes / 2**20
    if free < need:
        return fallback, f"{shm} has {free:.0f} MiB free, the drafter exchange needs {need:.0f} MiB"
    return shm, f"{shm} has {free:.0f} MiB free of the {need:.0f} MiB needed"


def drafter_root(replica_rank: int, need_bytes: int = 0) -> Path:
    """A node-local directory for one replica's drafter versions and weight exchange (``exchange_base``)."""
    base, why = exchange_base(need_bytes)
    if base != SHM:
        logger.warning("TLT vLLM replica %d exchanges drafter files under %s: %s", replica_rank, base, why)
    root = base / f"verl-tlt-{os.getuid()}" / f"vllm-drafter-{os.getpid()}-{replica_rank}"
    root.mkdir(parents=True, exist_ok=True)
    return root


def read_drafter_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of the export at `path`, on CPU."""
    return load_file(str(Path(path) / WEIGHTS_FILE), device="cpu")


def export_drafter_state(state: dict[str, torch.Tensor], hf_config, folder: str | os.PathLike, version: int) -> Path:
    """Write a drafter state dict (what the drafter trainers publish, either family) as the export vLLM loads.

    The state must fit the target described by `hf_config` exactly (strict load), or ValueError says what differs.
    """
    from verl_tlt.drafter.family import export_drafter, model_for_state
    from verl_tlt.modeling.model import ModelSpec

    try:
        model = model_for_state(state, ModelSpec.from_hf_config(hf_config))
    except ValueError as error:
        raise ValueError(f"Drafter version {version}: {error}") from error
    return export_drafter(model, folder, metadata={"version": version})
