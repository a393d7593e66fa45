#!/usr/bin/env bash
# CPU quickstart: set up .venv (idempotent), build the toy world, its drifting target and a warmed-up drafter
# (cached), then run verl GRPO four times with the torch rollout engine (without TLT, with TLT, with TLT and a
# frozen drafter, and without TLT again as a control), print the comparison, the identity check and the stage
# timings, and write outputs/quickstart/{summary.json,comparison.png}. Arguments go to `verl-tlt quickstart`
# (e.g. --steps 12). With --rollout vllm it sets up .venv-vllm (vLLM's CPU build) and runs verl's vLLM rollout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Whole seconds (bash's SECONDS works in every bash, also macOS's 3.2); the quickstart reports it as the setup stage.
SECONDS=0
PYTHON_FOR_RUN=""
for arg in "$@"; do  # --rollout vllm (or --rollout=vllm) needs the vLLM environment
  if [ "${prev:-}" = "--rollout" ] && [ "$arg" = "vllm" ] || [ "$arg" = "--rollout=vllm" ]; then PYTHON_FOR_RUN=vllm; fi
  prev="$arg"
done
if [ "$PYTHON_FOR_RUN" = "vllm" ]; then
  source "$ROOT/scripts/setup_vllm_env.sh"
  PYTHON_FOR_RUN="$VERL_TLT_VLLM_PYTHON"
else
  source "$ROOT/scripts/setup_env.sh"
  PYTHON_FOR_RUN="$VERL_TLT_PYTHON"
fi
export VERL_TLT_SETUP_S="$SECONDS"
cd "$ROOT"
exec "$PYTHON_FOR_RUN" -m verl_tlt.cli quickstart "$@"
