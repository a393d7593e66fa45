"""The quickstart's inputs for a real model: the prepared model (`verl-tlt models prepare`), reasoning-gym tasks as
verl parquet with their reward, and a drafter warmed up on the model's own answers to fresh problems of the same
tasks (`verl_tlt.tasks.drafter`: built once and cached, tens of minutes on 2 cores the first time)."""

from __future__ import annotations

import logging
from pathlib import Path

from verl_tlt.quickstart.recipe import INIT_FROM_TARGET, REAL_MODEL_TLT_OVERRIDES, GRPOSettings, QuickstartInputs

logger = logging.getLogger(__name__)


def prepare_real_model(
    model: str, cache: Path, data_dir: Path, settings: GRPOSettings, timer, warm_drafter: bool = True
) -> QuickstartInputs:
    """The model, the tasks for `settings.steps` steps of `settings.batch_size` prompts, and the model's drafter
    (warm_drafter=False: none; TLT's drafter starts from the target)."""
    import verl_tlt.tasks.reward as reward
    from verl_tlt.models.prepare import ensure_model
    from verl_tlt.tasks.dataset import grpo_task_files
    from verl_tlt.tasks.drafter import ensure_task_drafter

    with timer.stage("model"):
        actor = ensure_model(model, cache)
    with timer.stage("tasks"):
        data = grpo_task_files(actor, data_dir, settings.batch_size * settings.steps)
    drafter: Path | str = INIT_FROM_TARGET
    if warm_drafter:
        with timer.stage("drafter"):
            drafter = ensure_task_drafter(model, cache)
    logger.info("actor: %s; drafter: %s; tasks: %s", actor, drafter, data["train"])
    return QuickstartInputs(
        model=model,
        train_files=data["train"],
        val_files=data["val"],
        actor=actor,
        drafter=drafter,
        reward_fn=reward.__file__,
        reward_name="compute_score",
        max_prompt_length=data["max_prompt_length"],
        tlt_overrides=tuple(REAL_MODEL_TLT_OVERRIDES),
    )
