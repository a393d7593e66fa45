#!/usr/bin/env bash
# The test suite on a fresh machine: sets up .venv (scripts/setup_env.sh) and .venv-vllm (scripts/setup_vllm_env.sh),
# then runs every CPU test in .venv, including the verl GRPO end-to-end smoke, and the vLLM tier (tests marked
# `vllm`: TLT on vLLM's CPU build) in .venv-vllm, each under a hard timeout. Extra arguments go to both pytest runs.
# VERL_TLT_SKIP_VLLM=1 skips the vLLM tier (and its environment).
# --quick (first argument): the unit tier alone, for the edit loop: no verl job, no slow test, no vLLM tier.
set -uo pipefail
QUICK=0
if [ "${1:-}" = "--quick" ]; then
  QUICK=1
  shift
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" || exit 1
set +e  # the set-up script turns errexit on; a failing main tier must still let the vLLM tier run
cd "$ROOT"
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
# A hung Ray worker or vLLM engine must not hang CI: each run is bounded too (each verl job and vLLM test also has its
# own timeout). The main run takes 24-37 minutes on the 2-core hosts measured (docs/benchmarks.md, the test command
# per host kind) and about 1.5x that under one core; the bounds leave room for that.
if [ "$QUICK" = "1" ]; then
  timeout --kill-after=30 "${VERL_TLT_TEST_TIMEOUT:-1200}" "$VERL_TLT_PYTHON" -m pytest \
    -m "not gpu and not vllm and not e2e and not slow" "$@"
  exit $?
fi
# The vLLM environment (about 3 minutes of pip, mostly unpacking, the first time) is set up in the background while
# the main tier runs, and waited for before the vLLM tier; its log is shown then.
vllm_setup_pid=""
if [ "${VERL_TLT_SKIP_VLLM:-0}" != "1" ]; then
  vllm_setup_log="$(mktemp)"
  echo "[test] setting up the vLLM environment in the background (log: $vllm_setup_log)"
  bash "$ROOT/scripts/setup_vllm_env.sh" >"$vllm_setup_log" 2>&1 &
  vllm_setup_pid=$!
  # An interrupted run leaves no pip behind: pip is the set-up script's child, so it goes first (killing the
  # script alone orphans it).
  trap 'pkill -P "$vllm_setup_pid" 2>/dev/null; kill "$vllm_setup_pid" 2>/dev/null' EXIT
fi
# --durations: the slowest tests of each full run in every CI log, so the 35-minute budget can be kept by measurement.
timeout --kill-after=30 "${VERL_TLT_TEST_TIMEOUT:-3600}" "$VERL_TLT_PYTHON" -m pytest -m "not gpu and not vllm" \
  --durations=25 "$@"
main=$?
if [ "${VERL_TLT_SKIP_VLLM:-0}" = "1" ]; then
  echo "[test] vLLM tier skipped (VERL_TLT_SKIP_VLLM=1)"
  exit "$main"
fi
wait "$vllm_setup_pid"
setup=$?
trap - EXIT  # the set-up has ended: its pid is no longer ours to signal
cat "$vllm_setup_log"
rm -f "$vllm_setup_log"
[ "$setup" -eq 0 ] || { echo "[test] setting up the vLLM environment failed (above); main tier rc=$main" >&2; exit 1; }
source "$ROOT/scripts/setup_vllm_env.sh" || exit 1  # installed now: this only exports its interpreter
set +e
timeout --kill-after=30 "${VERL_TLT_VLLM_TEST_TIMEOUT:-1800}" "$VERL_TLT_VLLM_PYTHON" -m pytest -m "vllm" --durations=15 "$@"
tier=$?
[ "$tier" -eq 5 ] && tier=0  # pytest's "no tests collected": the arguments named main-tier tests only
echo "[test] main tier rc=$main, vLLM tier rc=$tier"
[ "$main" -eq 0 ] && [ "$tier" -eq 0 ]
