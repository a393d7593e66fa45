#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# GRPO for Qwen2.5-7B on one node of 8 GPUs with TLT on: adaptive speculative decoding in verl's vLLM rollout,
# starting from the drafter in DRAFTER (made by drafter_warmup.sh), which keeps training on a replica that has
# drained while the other still decodes. Its control is grpo_qwen2.5_7b_baseline.sh.
#   bash recipes/gpu/grpo_qwen2.5_7b_tlt.sh [Hydra overrides...]
# Paths and numbers: common_7b.sh. VERL_TLT_RECIPE_PRINT=1 prints the command instead of running it.
set -euo pipefail
# shellcheck source=common_7b.sh
source "$(dirname "${BASH_SOURCE[0]}")/common_7b.sh"
run_grpo_recipe tlt "$@"
