"""Build the toy world on disk: a tiny model + tokenizer, train/val parquet files and the reward function.

Why one entry point: demos, CPU benchmarks, recipes and tests all need the same offline artefacts, and verl
wants paths (model dir, parquet files, reward file), not objects. The build takes ~1 s but happens in many
processes, so it is idempotent: a `manifest.json` written last records the arguments, and a later call with
the same arguments returns the existing world. A file lock serialises concurrent builders of one folder.
"""

from __future__ import annotations

import inspect
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_tlt.files import write_json
from verl_tlt.toy.cache import exclusive_lock
from verl_tlt.toy.dataset import write_parquet
from verl_tlt.toy.model import build_tiny_model
from verl_tlt.toy.task import make_problems
from verl_tlt.toy.tokenizer import build_tokenizer

logger = logging.getLogger(__name__)

# Bump when the layout or the content for the same arguments changes, so stale worlds get rebuilt.
TOY_WORLD_VERSION = 2  # 2: tokenizer decoder no longer panics on empty output
MANIFEST_NAME = "manifest.json"
# Validation problems use a different stream than training ones, derived from the same seed.
_VAL_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class ToyWorld:
    """Absolute paths of a built toy world."""

    root: Path
    model_dir: Path
    train_parquet: Path
    val_parquet: Path
    reward_fn: Path

    @classmethod
    def at(cls, root: Path) -> ToyWorld:
        root = root.resolve()
        return cls(
            root=root,
            model_dir=root / "model",
            train_parquet=root / "data" / "train.parquet",
            val_parquet=root / "data" / "val.parquet",
            # The package's own file: it imports only verl_tlt.toy.task, which is installed with verl_tlt.
            reward_fn=Path(__file__).resolve().with_name("reward.py"),
        )


def build_toy_world(
    out_dir: str | Path,
    *,
    seed: int = 0,
    num_train: int = 512,
    num_val: int = 64,
    model_kwargs: dict[str, Any] | None = None,
) -> ToyWorld:
    """Build (or reuse) the toy world in `out_dir`; see the module docstring for the reuse rule."""
    if num_train < 1 or num_val < 1:
        raise ValueError(f"num_train and num_val must be >= 1, got num_train={num_train}, num_val={num_val}")
    world = ToyWorld.at(Path(out_dir))
    manifest = {
        "version": TOY_WORLD_VERSION,
        "seed": seed,
        "num_train": num_train,
        "num_val": num_val,
        "model_kwargs": _resolve_model_kwargs(model_kwargs, seed),
    }
    world.root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(world.root / ".build.lock"):
        if _is_complete(world, manifest):
            logger.info("Reusing toy world at %s", world.root)
            return world
        logger.info("Building toy world at %s (%s)", world.root, manifest)
        # Remove the manifest first: a build that dies halfway must not look complete afterwards.
        (world.root / MANIFEST_NAME).unlink(missing_ok=True)
        _write_world(world, manifest)
        write_json(world.root / MANIFEST_NAME, manifest)
    return world


def _write_world(world: ToyWorld, manifest: dict[str, Any]) -> None:
    tokenizer = build_tokenizer(model_max_length=manifest["model_kwargs"]["max_position_embeddings"])
    model = build_tiny_model(tokenizer, **manifest["model_kwargs"])
    model.save_pretrained(world.model_dir)
    tokenizer.save_pretrained(world.model_dir)
    seed = manifest["seed"]
    write_parquet(make_problems(manifest["num_train"], seed), world.train_parquet, split="train")
    write_parquet(make_problems(manifest["num_val"], seed + _VAL_SEED_OFFSET), world.val_parquet, split="val")


def _resolve_model_kwargs(model_kwargs: dict[str, Any] | None, seed: int) -> dict[str, Any]:
    """Fill in build_tiny_model's defaults, so equal models compare equal in the manifest."""
    parameters = inspect.signature(build_tiny_model).parameters
    defaults = {name: p.default for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    unknown = sorted(set(model_kwargs or {}) - set(defaults))
    if unknown:
        raise TypeError(f"unknown model_kwargs {unknown}; build_tiny_model accepts {sorted(defaults)}")
    return {**defaults, "seed": seed, **(model_kwargs or {})}


def _is_complete(world: ToyWorld, manifest: dict[str, Any]) -> bool:
    manifest_path = world.root / MANIFEST_NAME
    if not manifest_path.is_file():
        return False
    try:
        stored = json.loads(manifest_path.read_text())
    except json.JSONDecodeError:
        logger.warning("Ignoring unreadable %s; rebuilding", manifest_path)
        return False
    if stored != manifest:
        logger.info("Toy world at %s was built with %s; rebuilding for %s", world.root, stored, manifest)
        return False
    model_files = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"]
    required = [world.train_parquet, world.val_parquet, *(world.model_dir / name for name in model_files)]
    return all(path.is_file() for path in required)
