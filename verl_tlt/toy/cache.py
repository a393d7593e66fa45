"""Build-once caches under ~/.cache/verl-tlt (toy world, trained target, warmed-up drafter).

Entries are built with `verl_tlt.files.build_once`: a hidden sibling folder, swapped into place when complete, so a
killed build never leaves a half-written entry, and a file lock makes concurrent callers wait for a single build.
The helpers live in files.py (the kernel plans and the real models use them too); re-exported here.
"""

from __future__ import annotations

from verl_tlt.files import CACHE_ENV, build_once, default_cache_root, exclusive_lock

__all__ = ["CACHE_ENV", "build_once", "default_cache_root", "exclusive_lock"]
