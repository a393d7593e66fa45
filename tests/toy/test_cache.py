"""Build-once cache entries: built once, never half-written, and (in tests) never under the home directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_tlt.toy.cache import build_once, default_cache_root


def is_complete(entry: Path) -> bool:
    return (entry / "done").is_file()


def test_an_entry_is_built_once_then_reused(tmp_path):
    builds = []

    def build(out: Path) -> None:
        builds.append(out)
        (out / "done").write_text("1")

    entry = tmp_path / "entry"
    assert build_once(entry, is_complete, build, "thing") == entry
    assert build_once(entry, is_complete, build, "thing") == entry
    assert len(builds) == 1 and builds[0] != entry  # built beside the entry, then swapped in
    assert sorted(os.listdir(tmp_path)) == [".entry.lock", "entry"]


def test_a_failed_build_leaves_no_entry_and_the_next_call_builds_again(tmp_path):
    def failing(out: Path) -> None:
        (out / "half").write_text("written before the failure")
        raise RuntimeError("killed")

    entry = tmp_path / "entry"
    with pytest.raises(RuntimeError, match="killed"):
        build_once(entry, is_complete, failing, "thing")
    assert sorted(os.listdir(tmp_path)) == [".entry.lock"]
    build_once(entry, is_complete, lambda out: (out / "done").write_text("1"), "thing")
    assert is_complete(entry)


def test_an_incomplete_entry_is_replaced_whole(tmp_path):
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "stale").write_text("from an older layout")
    build_once(entry, is_complete, lambda out: (out / "done").write_text("1"), "thing")
    assert sorted(os.listdir(entry)) == ["done"]


def test_the_test_session_caches_outside_the_home_directory():
    """tests/conftest.py points the cache at the temporary directory, for this process and the ones it starts."""
    assert not default_cache_root().resolve().is_relative_to(Path.home().resolve())


@pytest.mark.slow
def test_processes_the_tests_start_cache_outside_the_home_directory():
    """verl jobs inherit the environment: their Hugging Face datasets/modules and matplotlib caches stay out too."""
    code = (
        "import datasets.config, huggingface_hub.constants\n"
        "from verl_tlt.toy.cache import default_cache_root\n"
        "print(datasets.config.HF_DATASETS_CACHE, huggingface_hub.constants.HF_HOME, default_cache_root(), sep='\\n')\n"
        "try:\n"
        "    import matplotlib\n"
        "    print(matplotlib.get_cachedir())\n"
        "except ImportError:\n"
        "    pass\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    paths = [Path(line).resolve() for line in result.stdout.split("\n") if line.strip()]
    assert len(paths) >= 3 and not [p for p in paths if p.is_relative_to(Path.home().resolve())], paths
