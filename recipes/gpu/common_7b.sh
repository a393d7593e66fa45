# shellcheck shell=bash
# shellcheck source-path=SCRIPTDIR
# Qwen2.5-7B GRPO on one node of 8 GPUs; sourced by grpo_qwen2.5_7b_tlt.sh and grpo_qwen2.5_7b_baseline.sh.
# The numbers follow fastrl's examples/grpo_7B.sh (the TLT paper's reference recipe), moved from SGLang to verl
# 0.9.1's vLLM rollout. Paths come from the environment (defaults below); a Hydra override after the recipe's
# name changes anything else, e.g. `bash recipes/gpu/grpo_qwen2.5_7b_tlt.sh trainer.total_training_steps=100`.
# Every variable below is read by common.sh's run_grpo_recipe (so shellcheck's unused-variable check is off).
# shellcheck disable=SC2034

RECIPES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# ----- paths and launcher (environment) -----------------------------------------------------------------------------
HF_MODEL_ID="Qwen/Qwen2.5-7B"
MODEL="${MODEL:-$HOME/models/Qwen2.5-7B}"
# The output directory of recipes/gpu/drafter_warmup.sh (tlt.drafter.init); the baseline does not read it.
DRAFTER="${DRAFTER:-$HOME/drafters/qwen2.5-7b-warmup}"
DATA_DIR="${DATA_DIR:-$HOME/data/eurus-2-rl}"
TRAIN_FILES="${TRAIN_FILES:-$DATA_DIR/train.parquet}"
VAL_FILES="${VAL_FILES:-$DATA_DIR/validation.parquet}"
OUT_DIR="${OUT_DIR:-$PWD/outputs/gpu_recipes}"
PROJECT="${PROJECT:-verl-tlt}"
EXPERIMENT="${EXPERIMENT:-qwen2.5-7b-grpo}"
PYTHON="${PYTHON:-python3}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
# Host CPU threads of each drafter worker (one per rollout replica: two here).
DRAFTER_THREADS="${DRAFTER_THREADS:-16}"

# ----- the recipe ---------------------------------------------------------------------------------------------------
NNODES=1
# 64 prompts x 8 responses per step, 4 prompts (32 responses) per actor mini-batch.
TRAIN_PROMPTS=64
RESPONSES_PER_PROMPT=8
MINI_BATCH_PROMPTS=4
MAX_PROMPT_LENGTH=1024
MAX_RESPONSE_LENGTH=32768
ACTOR_SP=4
# Tensor parallelism 4 on 8 GPUs: two vLLM replicas, so one can drain and train the drafter while the other decodes.
ROLLOUT_TP=4
GPU_MEMORY_UTILIZATION=0.4
TEMPERATURE=0.9
SAVE_FREQ=30
REQUIRE_RAY_CLUSTER=0

# shellcheck source=common.sh
source "$RECIPES_DIR/common.sh"
