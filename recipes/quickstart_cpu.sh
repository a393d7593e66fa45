#!/usr/bin/env bash
# CPU quickstart: set up .venv (idempotent), build the toy world, its drifting target and a warmed-up drafter
# (cached), then run verl GRPO three times with the torch rollout engine (without TLT, with TLT, with TLT and a
# frozen drafter), print the comparison and write outputs/quickstart/{summary.json,comparison.png}. Arguments go
# to `verl-tlt quickstart` (e.g. --steps 12).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$VERL_TLT_PYTHON" -m verl_tlt.cli quickstart "$@"
