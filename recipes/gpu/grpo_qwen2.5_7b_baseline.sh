#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# GRPO for Qwen2.5-7B on one node of 8 GPUs with TLT off: the control for grpo_qwen2.5_7b_tlt.sh, with the same verl
# overrides (both come from common_7b.sh) and tlt.enabled=false, which runs verl's own code paths.
#   bash recipes/gpu/grpo_qwen2.5_7b_baseline.sh [Hydra overrides...]
# Paths and numbers: common_7b.sh. VERL_TLT_RECIPE_PRINT=1 prints the command instead of running it.
set -euo pipefail
# shellcheck source=common_7b.sh
source "$(dirname "${BASH_SOURCE[0]}")/common_7b.sh"
run_grpo_recipe baseline "$@"
