"""The lower layers (spec, engine, drafter) never import verl, ray or vLLM (DESIGN.md section 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("verl", "ray", "vllm", "sglang")
PURE_PACKAGES = ("verl_tlt.spec", "verl_tlt.engine", "verl_tlt.drafter", "verl_tlt.metrics")

# Imports every module of the pure packages in one fresh interpreter, noting forbidden modules after each.
PROBE = """
import importlib, json, pkgutil, sys
report = {}
for package in PACKAGES:
    try:
        root = importlib.import_module(package)
    except ModuleNotFoundError:
        continue  # a layer that does not exist yet has nothing to check
    names = [package] + [package + "." + info.name for info in pkgutil.iter_modules(root.__path__)]
    for name in names:
        importlib.import_module(name)
        report[name] = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
print(json.dumps(report))
"""


def test_pure_layers_import_no_framework():
    code = f"PACKAGES = {PURE_PACKAGES!r}\nFORBIDDEN = {FORBIDDEN!r}\n{PROBE}"
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert any(name.startswith("verl_tlt.spec.") for name in report) and "verl_tlt.engine.engine" in report
    offenders = {name: bad for name, bad in report.items() if bad}
    assert not offenders, f"pure modules pulled in framework modules: {offenders}"
