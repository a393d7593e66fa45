"""What a verl run needs so that ``tlt.enabled=true`` really runs TLT: one check, called from every entry.

Asking for TLT and not getting it must stop the run at start-up, before Ray starts, with the override that
fixes it; never a silent stock run, never a failure minutes later in a Ray actor. Callers:

- ``python -m verl.trainer.main_ppo +tlt=on|off``: the Hydra callback that ``tlt/on.yaml`` and ``tlt/off.yaml``
  add (``hydra_callback``), when the job starts;
- ``python -m verl_tlt.main_ppo``: its ``main``, after it selected the trainer mode;
- the TLT trainer itself, when verl builds it (whatever started the run).

Importing this module is cheap: no verl, ray or torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from verl_tlt.config import ROOT_KEY, TLTConfig, tlt_view
from verl_tlt.integrations.verl.mode_selection import TLT_TRAINER_MODE, VERL_SYNC_MODE
from verl_tlt.request_seeds import SLOT_AGENT_LOOP

# The rollout name of verl-tlt's torch engine (the plugin registers it), and verl's vLLM rollout: TLT runs on both.
TORCH_ROLLOUT_NAME = "torch"
VLLM_ROLLOUT_NAME = "vllm"


class TLTNotAvailableError(RuntimeError):
    """``tlt.enabled=true`` was requested, but this run would not get TLT (trainer, rollout or build)."""


def tlt_config_of(config: Mapping[str, Any]) -> TLTConfig:
    """The composed verl config's ``tlt`` block, validated (absent: all defaults, TLT off)."""
    return tlt_view(config.get(ROOT_KEY))


def check_requirements(config: Mapping[str, Any]) -> TLTConfig:
    """Parse the ``tlt`` block of the composed verl config and, with TLT on, check the run can give TLT.

    Raises ``ValueError`` for a bad block or drafter directory, ``TLTNotAvailableError`` when the trainer or
    the rollout would run without TLT; each names the key, its value, why, and the override that fixes it.
    """
    tlt_cfg = tlt_config_of(config)
    if tlt_cfg.enabled:
        _check_trainer(config)
        _check_rollout(config, tlt_cfg)
        _check_drafter_init(tlt_cfg.drafter.init)
    return tlt_cfg


def _check_trainer(config: Mapping[str, Any]) -> None:
    use_v1 = _get(config, "trainer.use_v1")
    if use_v1 is not True:
        raise TLTNotAvailableError(
            f"{ROOT_KEY}.enabled=true needs verl's V1 trainer, got trainer.use_v1={_shown(use_v1)}: verl's legacy "
            f"trainer has no TLT mode, so the run would train without TLT. Fix: set trainer.use_v1=true, or "
            f"{ROOT_KEY}.enabled=false."
        )
    mode = _get(config, "trainer.v1.trainer_mode")
    if mode == VERL_SYNC_MODE:
        raise TLTNotAvailableError(
            f"{ROOT_KEY}.enabled=true, but trainer.v1.trainer_mode={VERL_SYNC_MODE} selects verl's own trainer, "
            f"which would run without TLT (this is what +tlt=off {ROOT_KEY}.enabled=true composes). Fix: turn TLT "
            f"on with +tlt=on (python -m verl.trainer.main_ppo ... +tlt=on), which selects "
            f"trainer.v1.trainer_mode={TLT_TRAINER_MODE}; or run python -m verl_tlt.main_ppo ... "
            f"{ROOT_KEY}.enabled=true, which selects it itself."
        )
    if mode != TLT_TRAINER_MODE:
        raise TLTNotAvailableError(
            f"{ROOT_KEY}.enabled=true runs on verl's sync trainer only (as trainer mode {TLT_TRAINER_MODE}), got "
            f"trainer.v1.trainer_mode={_shown(mode)}, which has no TLT variant. Fix: drop the "
            f"trainer.v1.trainer_mode override (+tlt=on sets {TLT_TRAINER_MODE}; python -m verl_tlt.main_ppo maps "
            f"{VERL_SYNC_MODE} to it), or set {ROOT_KEY}.enabled=false."
        )


def _check_rollout(config: Mapping[str, Any], tlt_cfg: TLTConfig) -> None:
    name = _get(config, "actor_rollout_ref.rollout.name")
    if name == VLLM_ROLLOUT_NAME:
        _check_vllm_rollout(config, tlt_cfg)
        return
    if name != TORCH_ROLLOUT_NAME:
        raise TLTNotAvailableError(
            f"{ROOT_KEY}.enabled=true runs on actor_rollout_ref.rollout.name={VLLM_ROLLOUT_NAME} or "
            f"{TORCH_ROLLOUT_NAME} (verl-tlt's torch engine), got {_shown(name)}. Fix: set "
            f"actor_rollout_ref.rollout.name={VLLM_ROLLOUT_NAME} (on CPU: {TORCH_ROLLOUT_NAME}, +cpu=torch), or run "
            f"with {ROOT_KEY}.enabled=false (the default) for stock verl behaviour."
        )
    if tlt_cfg.speculative.group_drafts:
        _check_group_identity(config)
    if tlt_cfg.drafter.device == "cuda" and tlt_cfg.drafter.train:
        raise TLTNotAvailableError(
            f"{ROOT_KEY}.drafter.device=cuda trains each drafter on its rollout replica's GPU, but the "
            f"{TORCH_ROLLOUT_NAME} rollout runs on the host CPU (its replicas hold no GPU). Fix: "
            f"{ROOT_KEY}.drafter.device=auto (the host CPU here, the replica's GPU on vLLM) or "
            f"actor_rollout_ref.rollout.name={VLLM_ROLLOUT_NAME}."
        )


def _check_group_identity(config: Mapping[str, Any]) -> None:
    """Group drafts need each request's GRPO group, which only the slot-seeded agent loop sends."""
    key = "actor_rollout_ref.rollout.agent.default_agent_loop"
    agent_loop = _get(config, key)
    if agent_loop != SLOT_AGENT_LOOP:
        raise TLTNotAvailableError(
            f"{ROOT_KEY}.speculative.group_drafts=true drafts from each request's GRPO siblings, but {key}="
            f"{_shown(agent_loop)} does not tell the rollout which samples are siblings. Fix: {key}={SLOT_AGENT_LOOP} "
            f"(verl's single-turn agent loop that also names each request's group and seeds it from its slot), or "
            f"{ROOT_KEY}.speculative.group_drafts=false."
        )


def _check_vllm_rollout(config: Mapping[str, Any], tlt_cfg: TLTConfig) -> None:
    """What TLT cannot serve on verl's vLLM rollout, each with the override that fixes it."""
    rollout = "actor_rollout_ref.rollout"
    off = f"or set {ROOT_KEY}.enabled=false"
    if tlt_cfg.speculative.group_drafts:
        raise TLTNotAvailableError(
            f"{ROOT_KEY}.speculative.group_drafts=true with {rollout}.name={VLLM_ROLLOUT_NAME}: group drafts run in "
            f"verl-tlt's torch rollout only (vLLM runs one drafter, the EAGLE one TLT gives it). Fix: "
            f"{ROOT_KEY}.speculative.group_drafts=false, or {rollout}.name={TORCH_ROLLOUT_NAME}."
        )
    data_parallel = _get(config, f"{rollout}.data_parallel_size")
    if data_parallel not in (None, 1):
        raise TLTNotAvailableError(
            f"{ROOT_KEY}.enabled=true with {rollout}.data_parallel_size={data_parallel}: vLLM turns its per-batch-size "
            f"speculation schedule off under data parallelism, so TLT could not gate SD to the long tail. Fix: "
            f"{rollout}.data_parallel_size=1 (more replicas instead), {off}."
        )
    if _get(config, f"{rollout}.mtp.enable") and _get(config, f"{rollout}.mtp.enable_rollout"):
        raise TLTNotAvailableError(
            f"{ROOT_KEY}.enabled=true with {rollout}.mtp.enable_rollout=true: vLLM runs one drafter, and TLT's EAGLE "
            f"drafter would replace the MTP one. Fix: {rollout}.mtp.enable_rollout=false, {off}."
        )
    backend = _get(config, f"{rollout}.checkpoint_engine.backend")
    if backend == "delta_sharded":
        raise TLTNotAvailableError(
            f"{ROOT_KEY}.enabled=true with {rollout}.checkpoint_engine.backend=delta_sharded: that weight transfer "
            f"replaces the worker extension TLT loads drafters through. Fix: "
            f"{rollout}.checkpoint_engine.backend=naive, {off}."
        )
    for key in ("speculative_config", "worker_extension_cls"):
        value = _get(config, f"{rollout}.engine_kwargs.vllm.{key}")
        if value is not None:
            raise TLTNotAvailableError(
                f"{rollout}.engine_kwargs.vllm.{key}={value!r} is set, but with {ROOT_KEY}.enabled=true TLT sets it "
                f"(its drafter, K schedule and worker extension). Fix: remove that override, {off}."
            )
    from verl_tlt.integrations.vllm.speculative_config import chain_depths

    try:
        chain_depths(tlt_cfg.speculative)
    except ValueError as error:
        raise TLTNotAvailableError(str(error)) from error


def _check_drafter_init(init: str) -> None:
    if init == "target" or os.path.isfile(os.path.join(init, "config.json")):
        return
    raise ValueError(
        f"{ROOT_KEY}.drafter.init={init!r} is neither 'target' nor a drafter directory (no config.json there). "
        f"Fix: set {ROOT_KEY}.drafter.init=target to start from the target, or to the output directory of "
        "`verl-tlt drafter warmup`."
    )


def _get(config: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted key; None where a level is missing (``???`` in an OmegaConf config reads as None)."""
    node: Any = config
    for key in dotted.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _shown(value: Any) -> str:
    if value is None:
        return "<not set>"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
