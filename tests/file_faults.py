"""Fault injection for the temp-then-swap writes of `verl_tlt.files`, shared by the tests of its users."""

from __future__ import annotations

import os
from pathlib import Path


def fail_moving_into_place(monkeypatch, name: str) -> None:
    """Make the rename of `name`'s new temporary directory into place raise OSError("interrupted") (the rename of
    the previous directory aside still runs), as a failure between a swap's two renames would."""
    real_replace = os.replace

    def failing_replace(src, dst):
        if Path(src).name.startswith(f".{name}.tmp-"):
            raise OSError("interrupted")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
