#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# GRPO for Qwen2.5-32B on NNODES nodes of 8 GPUs (default 4) with TLT off: the control for grpo_qwen2.5_32b_tlt.sh,
# with the same verl overrides (both come from common_32b.sh) and tlt.enabled=false, which runs verl's own code
# paths. Needs a running Ray cluster of NNODES nodes; run it on the head node (slurm_32b.sbatch does both):
#   bash recipes/gpu/grpo_qwen2.5_32b_baseline.sh [Hydra overrides...]
# Paths and numbers: common_32b.sh. VERL_TLT_RECIPE_PRINT=1 prints the command instead of running it.
set -euo pipefail
# shellcheck source=common_32b.sh
source "$(dirname "${BASH_SOURCE[0]}")/common_32b.sh"
run_grpo_recipe baseline "$@"
