"""Build-once caches under ~/.cache/verl-tlt (toy world, trained target, warmed-up drafter).

Entries are built with `verl_tlt.files.atomic_directory` (a hidden sibling folder, swapped into place when
complete), so a killed build never leaves a half-written entry, and a file lock makes concurrent callers wait for a
single build.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from verl_tlt.files import CACHE_ENV, atomic_directory, default_cache_root, exclusive_lock

logger = logging.getLogger(__name__)

# CACHE_ENV, default_cache_root and exclusive_lock live in files.py (the kernel plans use them too); re-exported.
__all__ = ["CACHE_ENV", "build_once", "default_cache_root", "exclusive_lock"]


def build_once(entry: Path, is_complete: Callable[[Path], bool], build: Callable[[Path], None], what: str) -> Path:
    """Return `entry`, first running `build(tmp_dir)` (an empty directory) and swapping it into place if `entry` is
    not complete."""
    if is_complete(entry):
        logger.info("Reusing the %s at %s", what, entry)
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(entry.parent / f".{entry.name}.lock"):
        if is_complete(entry):
            logger.info("Reusing the %s at %s (built by another process)", what, entry)
            return entry
        if entry.exists():
            logger.warning("Removing incomplete %s %s", what, entry)
            shutil.rmtree(entry)
        logger.info("No cached %s at %s; building it once", what, entry)
        with atomic_directory(entry) as tmp:
            build(tmp)
        logger.info("Cached the %s at %s", what, entry)
    return entry
