"""Imports point one way: each part of `verl_tlt` imports only from the layers below it.

The layers, bottom to top, are the architecture: pure math and plain config at the bottom, the torch model code
that both the engine and the drafter build on, the drafter, the engine, the framework glue, then the tools and
entry points built on all of them. The lower layers also never import verl, ray or vLLM, so that they run (and
can move upstream) without any of them.

Both checks read every module of the package, lazy imports inside functions included, and fail, never skip, when
a module belongs to no layer or a layer named here has disappeared.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "verl_tlt"

# Bottom to top. A unit is a top-level module or sub-package of verl_tlt (`integrations.<framework>` for glue).
# A module may import its own unit and the units of lower layers; units of one layer do not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("spec", "files", "progress", "commands", "strict_config", "request_seeds", "chat", "cpu_affinity"),
    # The speculation decision (gate, policies, decode counters): pure Python, below the config that feeds it.
    ("policy",),
    ("config", "metrics"),
    ("modeling",),
    ("drafter",),
    ("engine",),
    # The control contract between the TLT runtime and a rollout server, and the bookkeeping both servers share.
    ("integrations.control",),
    # The two rollout backends, peers (neither imports the other): the torch engine's server, replica and adapter,
    # and TLT over verl's vLLM rollout; both sit below the verl glue that drives them.
    ("integrations.torch_rollout", "integrations.vllm"),
    ("integrations.verl",),
    # Real models from PyPI wheels (files and transformers only): below every command that takes `--model NAME`.
    ("models",),
    ("warmup",),
    ("toy",),
    # The real tasks: their evaluation serves a prepared model on the engine.
    ("tasks",),
    ("quickstart", "sim"),
    ("bench",),
    ("cli", "main_ppo", "hydra_conf"),
)
# Units that must exist (a renamed or deleted layer must be renamed here too, not silently drop out of the check).
REQUIRED_UNITS = (
    "spec",
    "policy",
    "config",
    "modeling",
    "drafter",
    "engine",
    "integrations.control",
    "integrations.torch_rollout",
    "integrations.vllm",
    "integrations.verl",
    "cli",
    "main_ppo",
)

FRAMEWORKS = ("verl", "ray", "vllm", "sglang")
FRAMEWORK_FREE = (
    "verl_tlt.spec",
    "verl_tlt.policy",
    "verl_tlt.config",
    "verl_tlt.modeling",
    "verl_tlt.drafter",
    "verl_tlt.engine",
    "verl_tlt.integrations.control",
)


def unit_of(module: str) -> str | None:
    """`verl_tlt.engine.engine` -> `engine`; `verl_tlt.integrations.verl.plugin` -> `integrations.verl`."""
    parts = module.split(".")
    if parts[0] != "verl_tlt" or len(parts) < 2:
        return None
    if parts[1] == "integrations":  # the namespace itself belongs to no layer; each framework's glue does
        return f"integrations.{parts[2]}" if len(parts) > 2 else None
    return parts[1]


def layer_index(unit: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if unit in layer), None)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in the file, including those inside functions."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.append((node.lineno, base))
            # `from verl_tlt import toy` imports the unit `toy`, not the package root
            if base == "verl_tlt":
                found += [(node.lineno, f"verl_tlt.{alias.name}") for alias in node.names]
    return found


def layer_violations(root: Path = PACKAGE_ROOT) -> list[str]:
    """Every import of a higher layer or of a sibling unit in the same layer, and every module of no layer."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        unit = unit_of(module)
        if unit is None:  # the package's own __init__
            continue
        own = layer_index(unit)
        if own is None:
            problems.append(f"{module}: unit '{unit}' is in no layer of tests/test_layering.py LAYERS; place it there")
            continue
        for line, imported in imported_modules(path, module):
            target = unit_of(imported)
            if target is None or target == unit:
                continue
            theirs = layer_index(target)
            if theirs is None or theirs > own or (theirs == own and target != unit):
                where = "in no layer" if theirs is None else f"layer {theirs}"
                problems.append(f"{module}:{line} (layer {own}, {unit}) imports {imported} ({where}, {target})")
    return problems


def test_every_import_points_down_the_layers():
    problems = layer_violations()
    assert not problems, "imports that point up or sideways:\n" + "\n".join(problems)


def test_every_required_layer_exists():
    units = {unit_of(module_name(p, PACKAGE_ROOT)) for p in PACKAGE_ROOT.rglob("*.py")}
    assert not [u for u in REQUIRED_UNITS if u not in units]


@pytest.mark.parametrize(
    "planted, expected",
    [
        ("from verl_tlt.engine.engine import RolloutEngine\n", "imports verl_tlt.engine.engine"),
        ("def f():\n    import verl_tlt.integrations.verl.plugin\n", "imports verl_tlt.integrations.verl.plugin"),
        ("from verl_tlt import engine\n", "imports verl_tlt.engine"),
        ("from ..engine import engine\n", "imports verl_tlt.engine"),
    ],
)
def test_the_check_finds_a_planted_upward_import(tmp_path, planted, expected):
    root = tmp_path / "verl_tlt"
    for unit in ("drafter", "engine", "integrations/verl"):
        (root / unit).mkdir(parents=True)
        (root / unit / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "engine" / "engine.py").write_text("from verl_tlt.drafter.model import Model\n")  # downward: allowed
    (root / "drafter" / "model.py").write_text(planted)
    problems = layer_violations(root)
    assert len(problems) == 1 and expected in problems[0] and problems[0].startswith("verl_tlt.drafter.model:")


def test_the_check_finds_a_module_outside_every_layer(tmp_path):
    root = tmp_path / "verl_tlt"
    (root / "newthing").mkdir(parents=True)
    (root / "newthing" / "__init__.py").write_text("")
    assert any("unit 'newthing' is in no layer" in p for p in layer_violations(root))


# Imports every module of the framework-free packages in one fresh interpreter, noting framework modules after each.
PROBE = """
import importlib, json, pkgutil, sys
report = {}
for package in PACKAGES:
    root = importlib.import_module(package)
    names = [package] + [package + "." + info.name for info in pkgutil.iter_modules(getattr(root, "__path__", []))]
    for name in names:
        importlib.import_module(name)
        report[name] = sorted(m for m in sys.modules if m.split(".")[0] in FRAMEWORKS)
print(json.dumps(report))
"""


def test_the_lower_layers_import_no_framework():
    code = f"PACKAGES = {FRAMEWORK_FREE!r}\nFRAMEWORKS = {FRAMEWORKS!r}\n{PROBE}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE_ROOT.parent)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"verl_tlt.engine.engine", "verl_tlt.drafter.trainer", "verl_tlt.modeling.model"} <= set(report)
    offenders = {name: sorted({module.split(".")[0] for module in bad}) for name, bad in report.items() if bad}
    assert not offenders, f"framework-free modules pulled in frameworks (after importing each): {offenders}"


def test_a_framework_import_in_a_lower_layer_would_be_found():
    # The probe's power: the same interpreter, told that a module it imports is a framework, reports it.
    code = f"PACKAGES = ('verl_tlt.spec',)\nFRAMEWORKS = ('torch',)\n{PROBE}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE_ROOT.parent)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert any(report.values())


# The simulator and the speculation floor run where torch is not installed (a laptop sizing a cluster, vLLM's
# engine-core process reading the policy): every module of theirs imports with torch made unimportable.
TORCH_FREE = ("verl_tlt.policy", "verl_tlt.sim")
NO_TORCH_PROBE = """
import importlib, json, pkgutil, sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("torch is blocked by the layering test")
        return None

sys.meta_path.insert(0, NoTorch())
failed = {}
for package in PACKAGES:
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        try:
            importlib.import_module(info.name)
        except ImportError as error:
            failed[info.name] = str(error)
print(json.dumps(failed))
"""


def torch_free_failures(source_root: Path) -> dict[str, str]:
    """Modules of TORCH_FREE that fail to import from `source_root` (the folder holding verl_tlt) without torch."""
    code = f"PACKAGES = {TORCH_FREE!r}\n{NO_TORCH_PROBE}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=source_root)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_simulator_and_the_speculation_floor_import_without_torch():
    assert torch_free_failures(PACKAGE_ROOT.parent) == {}


def test_a_torch_import_planted_in_the_simulator_would_be_found(tmp_path):
    shutil.copytree(PACKAGE_ROOT, tmp_path / "verl_tlt", ignore=shutil.ignore_patterns("__pycache__"))
    planted = tmp_path / "verl_tlt" / "sim" / "costs.py"
    planted.write_text(planted.read_text() + "\nimport torch  # planted\n")
    failures = torch_free_failures(tmp_path)
    assert "verl_tlt.sim.costs" in failures and "torch is blocked" in failures["verl_tlt.sim.costs"]
