#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Warm up the EAGLE drafter that the TLT recipes start from (tlt.drafter.init=DRAFTER): `verl-tlt drafter warmup`
# lets the target answer the first NUM_PROMPTS prompts of the RL training set, records its hidden states, trains a
# one-layer drafter on them and exports it to DRAFTER. Training on the target's own answers to the RL prompts, at
# the rollout's temperature, matches what the drafter will be asked to predict (EAGLE is sensitive to the prompt
# distribution); without it TLT would start from a copy of the target's last layer, which drafts poorly at first.
#
#   bash recipes/gpu/drafter_warmup.sh [more `verl-tlt drafter warmup` options, e.g. --seconds 7200]
#   MODEL=$HOME/models/Qwen2.5-32B DRAFTER=$HOME/drafters/qwen2.5-32b-warmup bash recipes/gpu/drafter_warmup.sh
#
# The command runs verl-tlt's torch engine on the GPU (DEVICE=cuda, the default): the target answers in bf16 (the
# whole target on one GPU: 15 GB at 7B, 65 GB at 32B), then the drafter trains there in bf16 with fp32 masters
# against the target's embedding and head alone. DEVICE=cpu runs both on the host in fp32 (hours at 7B); --seconds
# bounds the training part. VERL_TLT_RECIPE_PRINT=1 prints the command, one argument per line, instead of running it.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

MODEL="${MODEL:-$HOME/models/Qwen2.5-7B}"
DRAFTER="${DRAFTER:-$HOME/drafters/qwen2.5-7b-warmup}"
DATA_DIR="${DATA_DIR:-$HOME/data/eurus-2-rl}"
TRAIN_FILES="${TRAIN_FILES:-$DATA_DIR/train.parquet}"
VERL_TLT="${VERL_TLT:-verl-tlt}"
# The command's own defaults, except the temperature: the RL recipes sample at 0.9. Several temperatures, separated
# by spaces (e.g. "0 0.9"), answer every prompt once per temperature.
NUM_PROMPTS="${NUM_PROMPTS:-256}"
STEPS="${STEPS:-1000}"
MAX_TOKENS="${MAX_TOKENS:-512}"
TEMPERATURES="${TEMPERATURES:-0.9}"
# tlt.drafter.train_depth of the warm-up: 1 trains on the target's features only; deeper also trains later chain
# positions on the drafter's own features, at about that many times the cost per step.
TRAIN_DEPTH="${TRAIN_DEPTH:-1}"
SEED="${SEED:-0}"
DEVICE="${DEVICE:-cuda}"

read -r -a temperatures <<<"$TEMPERATURES"
cmd=(
  "$VERL_TLT" drafter warmup
  --target "$MODEL"
  --prompts "$TRAIN_FILES"
  --out "$DRAFTER"
  --num-prompts "$NUM_PROMPTS"
  --steps "$STEPS"
  --max-tokens "$MAX_TOKENS"
  --temperature "${temperatures[@]}"
  --train-depth "$TRAIN_DEPTH"
  --seed "$SEED"
  --device "$DEVICE"
  # Beside the export, not in it: the drafter directory holds exactly what vLLM and verl-tlt load.
  --json "${DRAFTER%/}.report.json"
  "$@"
)

status=0
recipe_preflight "${HF_MODEL_ID:-Qwen/Qwen2.5-7B}" "${cmd[@]}" || status=$?
[ "$status" = 3 ] && exit 0
[ "$status" = 0 ] || exit "$status"
exec "${cmd[@]}"
