# shellcheck shell=bash
# shellcheck source-path=SCRIPTDIR
# Qwen2.5-32B GRPO on NNODES nodes of 8 GPUs (default 4) that already form one Ray cluster; sourced by
# grpo_qwen2.5_32b_tlt.sh and grpo_qwen2.5_32b_baseline.sh, run on the cluster's head node (slurm_32b.sbatch
# starts the cluster and does that). The numbers follow fastrl's examples/grpo_32B_multi_nodes.sh, moved from
# SGLang to verl 0.9.1's vLLM rollout. Every path must be readable at the same place on every node.
# Every variable below is read by common.sh's run_grpo_recipe (so shellcheck's unused-variable check is off).
# shellcheck disable=SC2034

RECIPES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# ----- paths, launcher and cluster shape (environment) --------------------------------------------------------------
HF_MODEL_ID="Qwen/Qwen2.5-32B"
MODEL="${MODEL:-$HOME/models/Qwen2.5-32B}"
# The output directory of recipes/gpu/drafter_warmup.sh run for this model (tlt.drafter.init).
DRAFTER="${DRAFTER:-$HOME/drafters/qwen2.5-32b-warmup}"
DATA_DIR="${DATA_DIR:-$HOME/data/eurus-2-rl}"
TRAIN_FILES="${TRAIN_FILES:-$DATA_DIR/train.parquet}"
VAL_FILES="${VAL_FILES:-$DATA_DIR/validation.parquet}"
OUT_DIR="${OUT_DIR:-$PWD/outputs/gpu_recipes}"
PROJECT="${PROJECT:-verl-tlt}"
EXPERIMENT="${EXPERIMENT:-qwen2.5-32b-grpo}"
PYTHON="${PYTHON:-python3}"
NNODES="${NNODES:-4}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
# Host CPU threads of each drafter worker (one per rollout replica: one per node here).
DRAFTER_THREADS="${DRAFTER_THREADS:-16}"

# ----- the recipe ---------------------------------------------------------------------------------------------------
# 32 prompts per node x 8 responses per step, 8 prompts (64 responses) per actor mini-batch.
TRAIN_PROMPTS=$((32 * NNODES))
RESPONSES_PER_PROMPT=8
MINI_BATCH_PROMPTS=8
MAX_PROMPT_LENGTH=2048
MAX_RESPONSE_LENGTH=32768
ACTOR_SP=8
# One vLLM replica per node: NNODES replicas for the drafter to train on while others still decode.
ROLLOUT_TP=8
GPU_MEMORY_UTILIZATION=0.55
TEMPERATURE=0.9
SAVE_FREQ=30
# verl joins the running cluster (ray.init finds it); without one it would start a one-node cluster, too small for
# trainer.nnodes, so the recipe refuses to start instead.
REQUIRE_RAY_CLUSTER=1

# shellcheck source=common.sh
source "$RECIPES_DIR/common.sh"
