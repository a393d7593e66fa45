# shellcheck shell=bash
# Sourced (through common_7b.sh or common_32b.sh) by the GRPO recipes in recipes/gpu/; never run on its own.
#
# One function builds the whole verl command line from the variables the size file set, so that a TLT run and its
# baseline share every verl override and differ only in the TLT keys: the pair cannot drift apart. With
# VERL_TLT_RECIPE_PRINT=1 it prints the command, one argument per line, and runs nothing; that is how
# tests/recipes/test_gpu_recipes.py composes and checks every recipe's config on a CPU.

# recipe_preflight HF_MODEL_ID COMMAND...: with VERL_TLT_RECIPE_PRINT=1, print COMMAND one argument per line and
# return 3 (the caller stops, successfully); otherwise return 1 when MODEL is not a local checkpoint directory
# (verl-tlt reads the target's weights from disk for the drafter checks and workers: a hub id is not enough), else 0.
recipe_preflight() {
  local hf_model_id="$1"
  shift
  if [ "${VERL_TLT_RECIPE_PRINT:-0}" = "1" ]; then
    printf '%s\n' "$@"
    return 3
  fi
  if [ ! -f "${MODEL}/config.json" ]; then
    echo "MODEL=${MODEL} is not a local checkpoint directory (no config.json). Download it first, e.g." >&2
    echo "  huggingface-cli download ${hf_model_id} --local-dir ${MODEL}" >&2
    return 1
  fi
}

# run_grpo_recipe tlt|baseline [extra Hydra overrides, last so they win]
run_grpo_recipe() {
  local arm="$1"
  shift
  local name="${EXPERIMENT}-${arm}"
  local run_dir="${OUT_DIR}/${name}"
  # One whole prompt plus the longest response: the token budget of a dynamic micro-batch and of a vLLM engine step.
  local max_tokens=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))
  local -a cmd=(
    "$PYTHON" -m verl_tlt.main_ppo
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=false
    "data.train_files=${TRAIN_FILES}"
    "data.val_files=${VAL_FILES}"
    "data.train_batch_size=${TRAIN_PROMPTS}"
    "data.max_prompt_length=${MAX_PROMPT_LENGTH}"
    "data.max_response_length=${MAX_RESPONSE_LENGTH}"
    # Prompts longer than the limit are dropped up front instead of failing a step.
    data.filter_overlong_prompts=true
    data.truncation=error
    "actor_rollout_ref.model.path=${MODEL}"
    # Ulysses sequence parallelism needs padding-free batches.
    actor_rollout_ref.model.use_remove_padding=true
    actor_rollout_ref.model.enable_gradient_checkpointing=true
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.optim.lr=1e-6
    "actor_rollout_ref.actor.ppo_mini_batch_size=${MINI_BATCH_PROMPTS}"
    # Micro-batches packed by tokens; the ref and rollout log-prob passes follow these two through verl's defaults.
    actor_rollout_ref.actor.use_dynamic_bsz=true
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${max_tokens}"
    # Ulysses sequence parallelism, set on the engine keys (verl 0.9.1 marks actor.ulysses_sequence_parallel_size
    # deprecated).
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=${ACTOR_SP}"
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size=${ACTOR_SP}"
    # GRPO's KL term in the loss, not in the reward.
    actor_rollout_ref.actor.use_kl_loss=true
    actor_rollout_ref.actor.kl_loss_coef=0.001
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.entropy_coeff=0
    # Weights and optimizer state stay in host memory between uses, leaving the GPUs to vLLM during the rollout.
    actor_rollout_ref.actor.fsdp_config.param_offload=true
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=true
    actor_rollout_ref.ref.fsdp_config.param_offload=true
    actor_rollout_ref.rollout.name=vllm
    "actor_rollout_ref.rollout.tensor_model_parallel_size=${ROLLOUT_TP}"
    "actor_rollout_ref.rollout.gpu_memory_utilization=${GPU_MEMORY_UTILIZATION}"
    "actor_rollout_ref.rollout.temperature=${TEMPERATURE}"
    "actor_rollout_ref.rollout.n=${RESPONSES_PER_PROMPT}"
    "actor_rollout_ref.rollout.max_num_batched_tokens=${max_tokens}"
    trainer.critic_warmup=0
    # verl's file logger writes every step's metrics (timing_s/*, tlt/*) to a JSONL file; the variable must reach
    # the Ray actor that logs, which may sit on another node, hence the runtime environment and not this shell.
    "trainer.logger=[console,file]"
    "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=${run_dir}/metrics.jsonl"
    "trainer.project_name=${PROJECT}"
    "trainer.experiment_name=${name}"
    "trainer.default_local_dir=${run_dir}/checkpoints"
    trainer.val_before_train=false
    trainer.test_freq=-1
    "trainer.save_freq=${SAVE_FREQ}"
    trainer.total_epochs=1
    "trainer.nnodes=${NNODES}"
    "trainer.n_gpus_per_node=${GPUS_PER_NODE}"
  )
  case "$arm" in
    tlt)
      cmd+=(
        tlt.enabled=true
        "tlt.drafter.init=${DRAFTER}"
        # fastrl's bs_threshold (also TLT's default): speculate once a replica runs at most 32 requests.
        tlt.speculative.threshold=32
        # The drafter workers spot-train on the host CPU and take their thread count from the torch engine's
        # options, whatever the rollout; vLLM itself never reads engine_kwargs.torch.
        "+actor_rollout_ref.rollout.engine_kwargs.torch.num_threads=${DRAFTER_THREADS}"
      )
      ;;
    baseline)
      cmd+=(tlt.enabled=false)
      ;;
    *)
      echo "run_grpo_recipe: the arm is tlt or baseline, got '${arm}'" >&2
      return 2
      ;;
  esac
  cmd+=("$@")

  local status=0
  recipe_preflight "$HF_MODEL_ID" "${cmd[@]}" || status=$?
  [ "$status" = 3 ] && return 0
  [ "$status" = 0 ] || return "$status"
  if [ "${REQUIRE_RAY_CLUSTER:-0}" = "1" ] && ! ray status >/dev/null 2>&1; then
    echo "No running Ray cluster found (ray status failed; RAY_ADDRESS=${RAY_ADDRESS:-<unset>}). Start one on" >&2
    echo "${NNODES} nodes first, e.g. with recipes/gpu/slurm_32b.sbatch, and run this on its head node." >&2
    return 1
  fi
  mkdir -p "$run_dir"
  echo "[verl-tlt recipe] ${name}: checkpoints and metrics.jsonl under ${run_dir}" >&2
  exec "${cmd[@]}"
}
