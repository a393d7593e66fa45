"""Results are written whole or not at all: files in one rename, directories in a swap a crash cannot half-do."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.file_faults import fail_moving_into_place
from verl_tlt.files import atomic_directory, atomic_write_text, previous_directory, write_json


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


# ----- directories ------------------------------------------------------------------------------------------------


def contents(path: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in path.iterdir()}


def test_a_directory_appears_only_when_complete(tmp_path):
    target = tmp_path / "out" / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("1")
        assert not target.exists()  # while the block writes, readers see nothing
        assert tmp.parent == target.parent and tmp.name.startswith(".ckpt.tmp-")
    assert contents(target) == {"a.txt": "1"}
    assert sorted(os.listdir(target.parent)) == ["ckpt"]


def test_replacing_swaps_the_whole_directory_and_drops_the_previous(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "old_only.txt").write_text("old")
    with atomic_directory(target) as tmp:
        (tmp / "new.txt").write_text("new")
    assert contents(target) == {"new.txt": "new"}  # nothing of the previous directory survives in the new one
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_an_error_in_the_block_keeps_the_previous_directory_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("old")
    with pytest.raises(RuntimeError, match="half way"):
        with atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("half way")
    assert contents(target) == {"a.txt": "old"}
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_a_failed_second_rename_puts_the_previous_directory_back(tmp_path, monkeypatch):
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("old")
    fail_moving_into_place(monkeypatch, "ckpt")
    with pytest.raises(OSError, match="interrupted"):
        with atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text("new")
    assert contents(target) == {"a.txt": "old"}
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_after_a_crash_between_the_renames_the_previous_directory_is_kept_and_the_next_write_supersedes_it(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("old")
    os.replace(target, previous_directory(target))  # what a process killed between the two renames leaves
    assert contents(previous_directory(target)) == {"a.txt": "old"}
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("new")
    assert contents(target) == {"a.txt": "new"}
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_a_file_in_the_way_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "ckpt").write_text("a user's file")
    with pytest.raises(NotADirectoryError, match="ckpt exists and is not a directory"):
        with atomic_directory(tmp_path / "ckpt"):
            pytest.fail("the block must not run")
    assert (tmp_path / "ckpt").read_text() == "a user's file"
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_a_users_own_dot_old_directory_survives_replacements(tmp_path):
    (tmp_path / "ckpt.old").mkdir()
    (tmp_path / "ckpt.old" / "mine.txt").write_text("keep")
    for text in ("first", "second"):
        with atomic_directory(tmp_path / "ckpt") as tmp:
            (tmp / "a.txt").write_text(text)
    assert contents(tmp_path / "ckpt.old") == {"mine.txt": "keep"}
    assert contents(tmp_path / "ckpt") == {"a.txt": "second"}
