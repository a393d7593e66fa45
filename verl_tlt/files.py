"""Writing results without leaving half of them behind: write to a temporary path beside the target, then swap.

Files (`atomic_write_text`, `write_json`): one rename. A reader (another process, a resumed run, the user) sees
either the previous file or the complete new one, at any moment and after a crash at any point.

Directories (`atomic_directory`): POSIX renames a directory only onto an absent (or empty) one, so replacing a
directory takes two renames: the previous one moves aside to `previous_directory(path)`, then the new one moves in.
What a reader can observe at `path`:

* never a partly written directory: everything in it was written and flushed to disk before it appeared there;
* if the writing block or the swap fails, the previous directory, untouched (the temporary sibling is removed);
* during a replacement's two renames (microseconds), nothing; if the process dies exactly there, nothing until the
  next write, with the previous directory complete at `previous_directory(path)`: a reader that finds `path`
  missing may fall back to it (the drafter trainer's checkpoints do).

One writer per path at a time: writers that may race on the same path hold a lock (as `verl_tlt.toy.cache`'s
build-once entries do). Temporary siblings are hidden (`.<name>.tmp-...`); a process killed while writing leaves
one behind, which no reader ever mistakes for the real thing.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Environment variable naming the cache root; every builder (toy world, target, drafter, kernel plans) reads it here.
CACHE_ENV = "VERL_TLT_CACHE"


def default_cache_root() -> Path:
    """`$VERL_TLT_CACHE`, else ~/.cache/verl-tlt: where built artefacts (toy models, kernel plans) are kept."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "verl-tlt")


@contextmanager
def exclusive_lock(lock_path: str | Path) -> Iterator[None]:
    """Blocking `flock` on `lock_path` (created if missing), held for the `with` block."""
    import fcntl

    with open(lock_path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def build_once(entry: Path, is_complete: Callable[[Path], bool], build: Callable[[Path], None], what: str) -> Path:
    """Return the cache entry `entry`, first running `build(tmp_dir)` (an empty directory) and swapping it into place
    if `entry` is not complete. A lock beside it makes concurrent callers wait for one build; a killed build leaves
    no half-written entry (`atomic_directory`)."""
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


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically (same-directory temporary file, fsync, rename); creates parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, data: Any, *, indent: int | None = 2) -> Path:
    """Write `data` as JSON (atomically, with a final newline); values JSON cannot hold are written as strings."""
    return atomic_write_text(path, json.dumps(data, indent=indent, default=str) + "\n")


def previous_directory(path: str | Path) -> Path:
    """Where `atomic_directory` keeps the previous directory of `path` while it swaps the new one in.

    Hidden (`.<name>.old`), so that the swap, which deletes a stale one, never touches a user's own `<name>.old`.
    """
    path = Path(path)
    return path.with_name(f".{path.name}.old")


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary sibling of `path`; when the block ends without error, make it `path`.

    An existing `path` (a directory) is replaced; see the module docstring for what readers and crashes can
    observe. On error the temporary directory is removed and `path` is left as it was.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} exists and is not a directory; it cannot be replaced by one")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        _swap_into_place(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync(path.parent)


def _swap_into_place(tmp: Path, path: Path) -> None:
    """Rename `tmp` to `path`; an existing `path` moves aside first and is put back if the second rename fails."""
    previous = previous_directory(path)
    # A previous directory still there is either stale (`path` exists: the last swap died before deleting it) or
    # the only complete copy (`path` is missing: it died between the renames); both are superseded by `tmp`.
    if path.exists():
        shutil.rmtree(previous, ignore_errors=True)
        os.replace(path, previous)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.replace(previous, path)
            raise
    else:
        os.replace(tmp, path)
    shutil.rmtree(previous, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root` to disk, so the rename that publishes them never outlives them."""
    for folder, _, files in os.walk(root):
        for name in files:
            if not (Path(folder) / name).is_symlink():  # a link's target is not part of what was written here
                _fsync(Path(folder) / name)
        _fsync(Path(folder))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
