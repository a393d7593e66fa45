#!/usr/bin/env bash
# CPU quickstart: set up .venv (idempotent), build the toy world, its drifting target and a warmed-up drafter
# (cached), then run verl GRPO four times with the torch rollout engine (without TLT, with TLT, with TLT and a
# frozen drafter, and without TLT again as a control), print the comparison, the identity check and the stage
# timings, and write outputs/quickstart/{summary.json,comparison.png}. Arguments go to `verl-tlt quickstart`
# (e.g. --steps 12).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Whole seconds (bash's SECONDS works in every bash, also macOS's 3.2); the quickstart reports it as the setup stage.
SECONDS=0
source "$ROOT/scripts/setup_env.sh"
export VERL_TLT_SETUP_S="$SECONDS"
cd "$ROOT"
exec "$VERL_TLT_PYTHON" -m verl_tlt.cli quickstart "$@"
