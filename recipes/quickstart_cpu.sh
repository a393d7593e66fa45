#!/usr/bin/env bash
# CPU quickstart: set up .venv (idempotent), build the toy world, run a few verl GRPO steps with the torch
# rollout engine, print a summary and write outputs/quickstart/summary.json. Arguments go to
# `verl-tlt quickstart` (e.g. --steps 6).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$VERL_TLT_PYTHON" -m verl_tlt.cli quickstart "$@"
