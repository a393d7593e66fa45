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
  pip_install() {  # quiet pip with a line every 15 s while it works; its full log is shown only if it fails
    local log pid status waited=0; log="$(mktemp)"
    "$VENV/bin/python" -m pip install -q "$@" >"$log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
      sleep 1; waited=$((waited + 1))
      if [ $((waited % 15)) -eq 0 ]; then echo "[setup] still installing (${waited} s for this step)"; fi
    done
    wait "$pid" && status=0 || status=$?
    if [ "$status" -ne 0 ]; then
      cat "$log" >&2; echo "[setup] pip install $* failed" >&2; exit 1
    fi
    rm -f "$log"
  }
  pip_install --upgrade pip
  # torch first, alone, so the CPU wheel is what verl and transformers later see as satisfied.
  pip_install -c "$ROOT/constraints-cpu.txt" torch
  pip_install -c "$ROOT/constraints-cpu.txt" -e "$ROOT[test,dev]"
  "$VENV/bin/python" -c "import torch, verl, verl_tlt; assert torch.__version__.startswith('2.13.0'), torch.__version__" \
    || { echo "[setup] install check failed" >&2; exit 1; }
  echo "$WANT" > "$STAMP"
fi
export VERL_TLT_PYTHON="$VENV/bin/python"
