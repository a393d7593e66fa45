"""The verl internals verl-tlt relies on (patches/verl_symbols.txt) exist in the installed verl, and every patch in
patches/verl/ applies to it as proposed upstream.

A failure names the symbol or patch: after a verl upgrade it says which internal moved, and so which part of
verl-tlt to revisit, before a run finds out. Rows in verl's vLLM rollout import vLLM: they carry the `vllm` marker
and run only in the vLLM tier, where tests/integrations/vllm/test_vllm_patches.py checks them too (with
patches/vllm/).
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import py_compile
import re
import shutil
import subprocess
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
PATCHES = REPO_ROOT / "patches"
SYMBOLS_FILE = PATCHES / "verl_symbols.txt"
PATCH_DIR = PATCHES / "verl"
# The verl release the symbol list and the patches were written against.
VERL_VERSION = "0.9.1"
# verl modules that import vLLM at the top: their rows can only be checked where vLLM is installed.
VLLM_MODULE_PREFIX = "verl.workers.rollout.vllm_rollout."


@dataclass(frozen=True)
class Symbol:
    name: str  # module:qualified.name
    check: str  # object | self-attr | literal:TEXT
    used_by: str
    patch: str  # patch number, or "-"

    @property
    def module(self) -> str:
        return self.name.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.name.partition(":")[2]

    @property
    def needs_vllm(self) -> bool:
        return self.module.startswith(VLLM_MODULE_PREFIX)


def read_symbols(path: Path = SYMBOLS_FILE) -> list[Symbol]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 4 or ":" not in fields[0]:
            raise ValueError(f"{path.name}:{number}: expected 'module:name check used-by patch', got {line!r}")
        rows.append(Symbol(*fields))
    return rows


def resolve(symbol: Symbol) -> None:
    """Raise LookupError naming the symbol and what is missing, if the installed verl lacks it."""
    try:
        owner = importlib.import_module(symbol.module)
    except ImportError as error:
        raise LookupError(f"{symbol.name}: module {symbol.module} does not import ({error})") from error
    *parents, last = symbol.qualname.split(".")
    for part in parents:
        if not hasattr(owner, part):
            raise LookupError(f"{symbol.name}: {getattr(owner, '__name__', owner)} has no attribute {part!r}")
        owner = getattr(owner, part)
    if symbol.check == "object":
        if not hasattr(owner, last):
            raise LookupError(f"{symbol.name}: {getattr(owner, '__name__', owner)} has no attribute {last!r}")
    elif symbol.check == "self-attr":
        if not any(last in _assigned_self_attributes(cls) for cls in inspect.getmro(owner) if cls is not object):
            raise LookupError(f"{symbol.name}: no class in {owner.__name__}'s MRO assigns self.{last}")
    elif symbol.check.startswith("literal:"):
        text = symbol.check.partition(":")[2]
        if not hasattr(owner, last):
            raise LookupError(f"{symbol.name}: {getattr(owner, '__name__', owner)} has no attribute {last!r}")
        if text not in _string_constants(getattr(owner, last)):
            raise LookupError(f"{symbol.name}: its source no longer holds the string {text!r}")
    elif symbol.check.startswith("param:"):
        if not hasattr(owner, last):
            raise LookupError(f"{symbol.name}: {getattr(owner, '__name__', owner)} has no attribute {last!r}")
        parameters = inspect.signature(getattr(owner, last)).parameters
        missing = [name for name in symbol.check.partition(":")[2].split(",") if name not in parameters]
        if missing:
            raise LookupError(f"{symbol.name}: takes no parameter {', '.join(missing)}")
    else:
        raise ValueError(
            f"{symbol.name}: unknown check {symbol.check!r} (object, self-attr, literal:TEXT or param:A,B)"
        )


def _tree(obj) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(obj)))


def _assigned_self_attributes(cls: type) -> set[str]:
    try:
        tree = _tree(cls)
    except (OSError, TypeError):  # a class without Python source (builtins, extensions) assigns nothing we can see
        return set()
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


def _string_constants(function) -> set[str]:
    function = inspect.unwrap(function)
    return {
        node.value
        for node in ast.walk(_tree(function))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


SYMBOLS = read_symbols()


# ----- the symbols ----------------------------------------------------------------------------------------------


def symbol_params(symbols: list[Symbol]) -> list:
    """One pytest param per row; rows whose module imports vLLM are marked `vllm` (skipped where it is missing)."""
    return [
        pytest.param(s, id=f"{s.name}[{s.check}]", marks=[pytest.mark.vllm] if s.needs_vllm else []) for s in symbols
    ]


@pytest.mark.parametrize("symbol", symbol_params(SYMBOLS))
def test_the_installed_verl_has_the_symbol(symbol):
    try:
        resolve(symbol)
    except LookupError as error:
        pytest.fail(f"verl {_installed_verl()} lacks an internal that {symbol.used_by} relies on: {error}")


@pytest.mark.parametrize(
    "planted, missing",
    [
        (Symbol("verl.workers.rollout.base:_NO_SUCH_REGISTRY", "object", "x", "-"), "'_NO_SUCH_REGISTRY'"),
        (Symbol("verl.no_such_module:thing", "object", "x", "-"), "module verl.no_such_module does not import"),
        (Symbol("verl.workers.rollout.replica:RolloutReplica._no_handle", "self-attr", "x", "-"), "self._no_handle"),
        (
            Symbol("verl.trainer.ppo.v1.trainer_base:PPOTrainer._save_checkpoint", "literal:tlt_sync", "x", "-"),
            "no longer holds the string 'tlt_sync'",
        ),
        (Symbol("verl.workers.rollout.replica:NoSuchReplica.servers", "self-attr", "x", "-"), "'NoSuchReplica'"),
        (
            Symbol("verl.workers.rollout.replica:RolloutReplicaRegistry.register", "param:name,no_such", "x", "-"),
            "takes no parameter no_such",
        ),
    ],
)
def test_a_missing_symbol_is_named(planted, missing):
    with pytest.raises(LookupError, match=re.escape(missing)) as error:
        resolve(planted)
    assert str(error.value).startswith(planted.name)


def test_the_symbol_file_refuses_a_malformed_row(tmp_path):
    bad = tmp_path / "symbols.txt"
    bad.write_text("# comment\nverl.utils.distributed:initialize_global_process_group object only-three\n")
    with pytest.raises(ValueError, match=r"symbols.txt:2: expected"):
        read_symbols(bad)


def test_every_listed_patch_exists_and_every_patch_is_listed():
    listed = {symbol.patch for symbol in SYMBOLS} - {"-"}
    present = {path.name.split("-", 1)[0] for path in PATCH_DIR.glob("*.patch")}
    assert listed == present


def test_the_readme_table_lists_exactly_the_symbol_files_rows():
    readme = (PATCHES / "README.md").read_text()
    rows = re.findall(r"^\| `(verl\.[^`:]+:[^`]+)` \| `([^`]+)` \|", readme, flags=re.MULTILINE)
    assert sorted(rows) == sorted((s.name, s.check) for s in SYMBOLS)


# ----- the patches ----------------------------------------------------------------------------------------------

PATCH_FILES = sorted(PATCH_DIR.glob("*.patch"))
needs_patch = pytest.mark.skipif(shutil.which("patch") is None, reason="the `patch` program is not installed")


def patched_files(patch: Path) -> list[str]:
    """The verl files (relative to verl's repository root) that a patch changes."""
    return re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), flags=re.MULTILINE)


def pristine_copy(root: Path, files: list[str]) -> None:
    """Copies of the installed verl's files under root, laid out as in verl's repository."""
    site = Path(importlib.import_module("verl").__file__).parent.parent
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(site / name, root / name)


def run_patch(root: Path, patch: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["patch", "-p1", "--forward", "--batch", "--fuzz=0", *extra, "-i", str(patch)],
        cwd=root,
        capture_output=True,
        text=True,
    )


def check_applies_exactly(patch: Path, root: Path, copy: Callable[[Path, list[str]], None]) -> None:
    """`patch` applies to `copy`'s pristine files under root at its own lines (no offset, no fuzz)."""
    files = patched_files(patch)
    assert files, f"{patch.name} changes no file"
    copy(root, files)
    result = run_patch(root, patch, "--dry-run")
    assert result.returncode == 0, f"{patch.name} does not apply:\n{result.stdout}{result.stderr}"
    assert "offset" not in result.stdout, f"{patch.name} applies only at other lines:\n{result.stdout}"


def check_apply_together(patches: list[Path], root: Path, copy: Callable[[Path, list[str]], None]) -> None:
    """The patches apply one after the other to pristine copies and leave files that compile."""
    files = sorted({name for patch in patches for name in patched_files(patch)})
    copy(root, files)
    for patch in patches:
        result = run_patch(root, patch)
        assert result.returncode == 0, f"{patch.name} on top of the earlier ones:\n{result.stdout}{result.stderr}"
    for name in files:
        py_compile.compile(str(root / name), doraise=True)


def test_the_patches_target_the_installed_verl():
    assert _installed_verl() == VERL_VERSION, (
        f"patches/ is written against verl {VERL_VERSION}, installed is {_installed_verl()}: check "
        "tests/integrations/verl/test_patch_symbols.py's symbols, then regenerate the patches against it"
    )


@pytest.mark.parametrize("patch", PATCH_FILES, ids=lambda p: p.name)
def test_each_patch_has_a_header_saying_what_it_lets_verl_tlt_delete(patch):
    header = patch.read_text().split("\n--- a/", 1)[0]
    assert f"verl {VERL_VERSION}" in header and "What:" in header and "Why:" in header
    assert "Lets verl-tlt delete:" in header


@needs_patch
@pytest.mark.parametrize("patch", PATCH_FILES, ids=lambda p: p.name)
def test_each_patch_applies_exactly_to_the_installed_verl(patch, tmp_path):
    check_applies_exactly(patch, tmp_path, pristine_copy)


@needs_patch
def test_the_patches_apply_together_in_order_and_leave_valid_python(tmp_path):
    check_apply_together(PATCH_FILES, tmp_path, pristine_copy)


@needs_patch
def test_a_patch_that_does_not_apply_is_caught(tmp_path):
    # The check's power: a patch whose context verl does not have is refused (no fuzz), not applied loosely.
    patch = PATCH_FILES[0]
    broken = tmp_path / "broken.patch"
    broken.write_text(re.sub(r"^ (\S)", r" x\1", patch.read_text(), count=1, flags=re.MULTILINE))
    pristine_copy(tmp_path / "verl-root", patched_files(patch))
    assert run_patch(tmp_path / "verl-root", broken, "--dry-run").returncode != 0


def _installed_verl() -> str:
    return importlib.metadata.version("verl")
