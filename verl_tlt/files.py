"""Writing results without leaving half a file behind: write to a temporary path beside the target, then swap.

A reader (another process, a resumed run, the user) sees either the previous file or the complete new one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


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
