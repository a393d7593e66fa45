"""What the quickstart runs: verl GRPO on CPU (on the toy world, or a real model on the reasoning-gym tasks), and
the runs it compares.

- baseline: TLT off. tlt: TLT on, the drafter trained online. frozen: TLT on, the drafter never trained.
- baseline_repeat: the baseline's config again, the control. Every run samples the same responses as long as their
  training stays bitwise equal (see the overrides); the control shows whether training on this machine is bitwise
  reproducible at all, so a difference TLT's runs share with it is not TLT's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from verl_tlt.integrations.verl.same_samples import SAME_SAMPLES_OVERRIDES

BASELINE = "baseline"
GROUP_DRAFTS = "tlt_group"
CONTROL = "baseline_repeat"
# Run name -> its own overrides, in the order the quickstart runs them (the control last: the comparison of the
# first three is complete if a user stops the quickstart during the control).
RUNS: dict[str, list[str]] = {
    BASELINE: ["tlt.enabled=false"],
    "tlt": ["tlt.enabled=true", "tlt.drafter.train=true"],
    "frozen": ["tlt.enabled=true", "tlt.drafter.train=false"],
    # TLT with drafts from the GRPO group too (siblings' answers, earlier answers), against "tlt" (the drafter only).
    GROUP_DRAFTS: ["tlt.enabled=true", "tlt.drafter.train=true", "tlt.speculative.group_drafts=true"],
    CONTROL: ["tlt.enabled=false"],
}
# The runs the headline ratios and the table compare.
COMPARED = (BASELINE, "tlt", "frozen")
TRACE_FILE = "rollout_trace.jsonl"
# The first stage: the virtualenv, set up by recipes/quickstart_cpu.sh before Python starts, which passes its time in.
SETUP_STAGE = "setup (virtualenv)"

# Drafter training for a 1M-parameter target on one CPU core: for the same compute, many small batches at a moderate
# lr follow the drifting policy better than a few large ones (judge a change with `verl-tlt bench drafter-replay` on
# a recorded run). Short steps also bound how long training can run past the last response.
TOY_DRAFTER_OVERRIDES = ["tlt.drafter.max_tokens_per_batch=256", "tlt.drafter.lr=1e-3"]
# Chains only: on this CPU every tree strategy decodes the toy slower than plain at every batch size, while the
# chains gain (`verl-tlt bench sd curve --strategies 8_4_16 6_4_8 4_1_4 2_1_2` shows it); exploring the trees would only
# cost the bandit steps. The default set (with trees) is for accelerators, where verifying more tokens is cheap.
CPU_STRATEGY_OVERRIDES = ['tlt.speculative.strategies=["4_1_4","2_1_2"]']


TOY = "toy"


@dataclass(frozen=True)
class GRPOSettings:
    """The quickstart's GRPO job: steps, prompts x samples per step, response cap, lr, replicas, rollout engine.
    The defaults are the toy's; `settings_for` gives each model's."""

    steps: int = 15
    batch_size: int = 16
    group_size: int = 8
    max_response_length: int = 256
    lr: float = 5e-4
    replicas: int = 2
    rollout: str = "torch"  # or "vllm": verl's vLLM rollout on vLLM's CPU build (+cpu=vllm)


# A real model's job, sized by one measured step so that its five runs fit about 35 minutes on 2 cores
# (docs/benchmarks.md): SmolLM2's TLT-off GRPO step of 4 x 4 answers up to 256 tokens took 88-119 s there (rollout
# 35-52 s, actor update 35 s) and a verl job about a minute to start, so 3 steps a run. GRPO's usual lr for a small
# instruct model.
REAL_MODEL_SETTINGS = GRPOSettings(steps=3, batch_size=4, group_size=4, max_response_length=256, lr=1e-6)
# What a real model's TLT run sets beyond the user's defaults: nothing (what a user gets is what the quickstart
# measures).
REAL_MODEL_TLT_OVERRIDES: list[str] = []


def settings_for(model: str) -> GRPOSettings:
    """The default job for `model` ('toy' or a real model's name)."""
    return GRPOSettings() if model == TOY else REAL_MODEL_SETTINGS


# tlt.drafter.init's value for a drafter started from the target (no warm-up).
INIT_FROM_TARGET = "target"


@dataclass(frozen=True)
class QuickstartInputs:
    """What a quickstart trains and drafts with: the RL data, the actor's initial weights, its reward, the drafter
    warmed up on the actor's own answers, and the model's own TLT settings."""

    model: str  # 'toy' or a real model's name
    train_files: Path
    val_files: Path
    actor: Path
    drafter: Path | str  # a drafter folder, or INIT_FROM_TARGET
    reward_fn: str  # a file with the reward function (verl's custom_reward_function.path)
    reward_name: str  # the function's name in it
    max_prompt_length: int
    tlt_overrides: tuple[str, ...] = field(default_factory=tuple)


def toy_grpo_overrides(
    world,
    *,
    steps: int,
    batch_size: int,
    group_size: int,
    max_response_length: int,
    lr: float,
    reward_fn: str | None = None,
    model_dir: str | Path | None = None,
    replicas: int = 1,
    rollout: str = "torch",
) -> list[str]:
    """verl overrides for GRPO on the toy world on CPU (see `grpo_overrides`).

    model_dir: the actor's initial weights (default: the world's untrained model), e.g. the SFT toy target.
    """
    return grpo_overrides(
        train_files=world.train_parquet,
        val_files=world.val_parquet,
        model_dir=model_dir or world.model_dir,
        reward_fn=reward_fn or world.reward_fn,
        max_prompt_length=16,
        steps=steps,
        batch_size=batch_size,
        group_size=group_size,
        max_response_length=max_response_length,
        lr=lr,
        replicas=replicas,
        rollout=rollout,
        experiment="toy_grpo",
    )


def grpo_overrides(
    *,
    train_files: str | Path,
    val_files: str | Path,
    model_dir: str | Path,
    reward_fn: str | Path,
    max_prompt_length: int,
    steps: int,
    batch_size: int,
    group_size: int,
    max_response_length: int,
    lr: float,
    replicas: int = 1,
    rollout: str = "torch",
    experiment: str = "grpo",
) -> list[str]:
    """verl overrides for GRPO on CPU (everything platform-specific comes from +cpu=<rollout>).

    reward_fn: a file with `compute_score` (verl's custom reward function).
    replicas: trainer workers = rollout replicas (one CPU core each); each worker gets an equal share of a batch.
    rollout: "torch" (verl-tlt's torch engine) or "vllm" (verl's vLLM rollout on vLLM's CPU build).
    """
    if (batch_size * group_size) % replicas:
        raise ValueError(f"{batch_size} prompts x {group_size} samples do not split evenly over {replicas} replicas")
    mini_batch = batch_size
    micro_batch = batch_size * group_size // replicas
    return [
        f"+cpu={rollout}",
        "algorithm.adv_estimator=grpo",
        f"data.train_files={train_files}",
        f"data.val_files={val_files}",
        f"data.train_batch_size={batch_size}",
        f"data.max_prompt_length={max_prompt_length}",
        f"data.max_response_length={max_response_length}",
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_batch}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        f"actor_rollout_ref.rollout.n={group_size}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro_batch}",
        f"reward.custom_reward_function.path={reward_fn}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        f"trainer.n_gpus_per_node={replicas}",
        "trainer.save_freq=-1",
        f"trainer.total_training_steps={steps}",
        "trainer.project_name=verl_tlt_quickstart",
        f"trainer.experiment_name={experiment}",
    ]


def quickstart_overrides(inputs: QuickstartInputs, settings: GRPOSettings, extra: Sequence[str] = ()) -> list[str]:
    """The overrides every run shares: GRPO on the inputs' data from the actor, the warmed-up drafter, the CPU
    settings of TLT, then `extra` (last, so they win)."""
    common = grpo_overrides(
        train_files=inputs.train_files,
        val_files=inputs.val_files,
        model_dir=inputs.actor,
        reward_fn=inputs.reward_fn,
        max_prompt_length=inputs.max_prompt_length,
        steps=settings.steps,
        batch_size=settings.batch_size,
        group_size=settings.group_size,
        max_response_length=settings.max_response_length,
        lr=settings.lr,
        replicas=settings.replicas,
        rollout=settings.rollout,
        experiment=f"{inputs.model}_grpo",
    )
    return [
        *common,
        # Every slot samples alike in all runs and every batch is trained on in slot order, so the runs train to the
        # same weights and differ in how fast they decode, not in what they sample (the weight checksums in the
        # rollout traces, and the control run, check it).
        *SAME_SAMPLES_OVERRIDES,
        f"reward.custom_reward_function.name={inputs.reward_name}",
        f"tlt.drafter.init={inputs.drafter}",
        *inputs.tlt_overrides,
        *CPU_STRATEGY_OVERRIDES,
        *extra,
    ]


def run_overrides(name: str, common: list[str], run_dir: Path) -> list[str]:
    """One run's full overrides: the shared ones, the run's own, and its rollout trace (with weight checksums)."""
    if name not in RUNS:
        raise ValueError(f"Unknown quickstart run {name!r}; choose from {list(RUNS)}")
    trace = f"+actor_rollout_ref.rollout.engine_kwargs.torch.trace_path={run_dir / TRACE_FILE}"
    return [*common, *RUNS[name], trace]


def check_same_tokenizer(world_model_dir: Path, actor_dir: Path) -> None:
    """The parquet prompts and the reward parse text in the world's tokenizer; the actor must use the same one.

    Compared by behaviour (vocabulary, chat template, a round trip), not by file bytes, which may differ
    harmlessly across transformers versions.
    """
    from transformers import AutoTokenizer

    world, actor = (AutoTokenizer.from_pretrained(str(d)) for d in (world_model_dir, actor_dir))
    sample = "23 - 7 = 16 ; 16 - 7 = 9 ; 9 - 7 = 2 ; 2 - 7 < 0 ; # 2"
    same = (
        world.get_vocab() == actor.get_vocab()
        and world.chat_template == actor.chat_template
        and world.encode(sample, add_special_tokens=False) == actor.encode(sample, add_special_tokens=False)
        and actor.decode(actor.encode(sample, add_special_tokens=False)) == sample
    )
    if not same:
        raise RuntimeError(
            f"The tokenizer in {actor_dir} differs from the toy world's ({world_model_dir}): the actor would read "
            "the prompts and write responses in another tokenisation. Delete the stale cache entries and rerun."
        )
