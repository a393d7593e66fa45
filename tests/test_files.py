"""Results are written whole or not at all."""

from __future__ import annotations

import json
import os

import pytest

from verl_tlt.files import atomic_write_text, write_json


def test_write_json_creates_folders_and_reads_back(tmp_path):
    path = write_json(tmp_path / "a" / "b.json", {"x": [1, 2], "p": tmp_path})
    assert json.loads(path.read_text()) == {"x": [1, 2], "p": str(tmp_path)} and path.read_text().endswith("\n")


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = atomic_write_text(tmp_path / "r.txt", "old")

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(path, "new")
    assert path.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["r.txt"]
