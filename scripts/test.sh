#!/usr/bin/env bash
# The test suite on a fresh machine: sets up .venv (scripts/setup_env.sh), then runs every CPU test,
# including the verl GRPO end-to-end smoke (under a hard timeout). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
# A hung Ray worker must not hang CI: the whole run is bounded too (each verl job also has its own timeout). About
# 20 minutes on a quiet 2-core machine; the bound leaves room for a machine at about half that speed.
exec timeout --kill-after=30 "${VERL_TLT_TEST_TIMEOUT:-2700}" "$VERL_TLT_PYTHON" -m pytest -m "not gpu and not vllm" "$@"
