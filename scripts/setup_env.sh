#!/usr/bin/env bash
# Create or reuse the project's virtualenv (.venv) with CPU torch, verl 0.9.1 and verl-tlt (editable).
# Idempotent: re-installs only when pyproject.toml or the constraints changed. Source it or run it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VERL_TLT_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.verl_tlt_installed"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints-cpu.txt" | sha256sum | cut -c1-16)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[setup] installing torch (CPU), verl 0.9.1 and verl-tlt into $VENV (about 2 minutes the first time)"
  source "$ROOT/scripts/pip_progress.sh"
  require_free_space "$VENV" 3 "the main environment (VERL_TLT_VENV)"
  require_free_space "${TMPDIR:-/tmp}" 1 "pip's unpacking (TMPDIR)"
  pip_install "$VENV" --upgrade pip
  # torch first, alone, so the CPU wheel is what verl and transformers later see as satisfied.
  pip_install "$VENV" -c "$ROOT/constraints-cpu.txt" torch
  pip_install "$VENV" -c "$ROOT/constraints-cpu.txt" -e "$ROOT[test,dev]"
  "$VENV/bin/python" -c "import torch, verl, verl_tlt; assert torch.__version__.startswith('2.13.0'), torch.__version__" \
    || { echo "[setup] install check failed" >&2; exit 1; }
  echo "$WANT" > "$STAMP"
fi
export VERL_TLT_PYTHON="$VENV/bin/python"
