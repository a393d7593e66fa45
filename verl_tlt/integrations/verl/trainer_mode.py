"""The ``tlt_sync`` V1 trainer mode: verl's ``PPOTrainerSync`` plus TLT's runtime, and where that mode is selected.

verl picks the trainer class from ``TRAINER_REGISTRY`` by ``trainer.v1.trainer_mode``; a name cannot be
re-registered to another class, so TLT adds a new mode instead of replacing ``sync``. ``+tlt=on`` (stock
entry point) sets it; ``verl_tlt.main_ppo`` with ``tlt.enabled=true`` selects it (:func:`select_trainer_mode`).

Importing this module is cheap: verl is imported only inside :func:`register_trainer_mode` /
:func:`get_trainer_class`. The class is reachable as ``verl_tlt.integrations.verl.trainer_mode.TLTTrainerSync``
(built on first access) so that pickle finds it by reference.
"""

from __future__ import annotations

import logging
from typing import Any

from verl_tlt.config import TLTConfig
from verl_tlt.integrations.verl.mode_selection import TLT_TRAINER_MODE, VERL_SYNC_MODE

logger = logging.getLogger(__name__)

_trainer_cls: type | None = None


def get_trainer_class() -> type:
    """Return the TLT trainer class, building it (and importing verl) on first use."""
    global _trainer_cls
    if _trainer_cls is None:
        _trainer_cls = _build_trainer_class()
    return _trainer_cls


def register_trainer_mode() -> None:
    """Register ``tlt_sync`` in verl's V1 trainer registry; safe to call any number of times."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer

    cls = get_trainer_class()
    existing = TRAINER_REGISTRY.get(TLT_TRAINER_MODE)
    if existing is cls:
        return
    if existing is not None:
        raise RuntimeError(
            f"verl trainer mode '{TLT_TRAINER_MODE}' is already registered to {existing.__module__}."
            f"{existing.__qualname__}, so verl-tlt cannot register its trainer under that name; another "
            "installed plugin uses it. Fix: uninstall the other plugin, or disable it with "
            "VERL_USE_EXTERNAL_PLUGINS=<comma-separated plugin names without it>."
        )
    register_trainer(TLT_TRAINER_MODE)(cls)
    logger.debug("registered verl trainer mode %s -> %s", TLT_TRAINER_MODE, cls.__qualname__)


class DisabledTLT:
    """The runtime of a run with ``tlt.enabled=false``: every hook does nothing, so the trainer is verl's.

    Same trainer-facing methods as ``tlt_runtime.TLTRuntime`` (a test holds them equal), so the trainer's hooks
    call their runtime without asking whether TLT is on.
    """

    def prepare_workers(self, role_worker_mapping: dict) -> None:
        pass

    def on_checkpoint_loaded(self, global_steps: int) -> None:
        pass

    def on_init_end(self, trainer: Any) -> None:
        pass

    def on_sample_begin(self) -> None:
        pass

    def before_sleep(self) -> None:
        pass

    def after_sleep(self) -> None:
        pass

    def after_validation(self) -> None:
        pass

    def arm_capture(self, step: int) -> None:
        pass

    def collect_capture(self) -> None:
        pass

    def on_step_end(self, step: int) -> None:
        pass

    def pop_metrics(self) -> dict[str, float]:
        return {}

    def save_checkpoint(self, step: int) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


def make_runtime(config: Any, tlt_config: TLTConfig) -> Any:
    """The trainer's runtime: TLT's (imports Ray, the drafter and the engine) only when TLT is on."""
    if not tlt_config.enabled:
        return DisabledTLT()
    from verl_tlt.integrations.verl.requirements import VLLM_ROLLOUT_NAME
    from verl_tlt.integrations.verl.tlt_runtime import TLTRuntime

    if config.actor_rollout_ref.rollout.name == VLLM_ROLLOUT_NAME:
        # Before verl builds its rollout servers (the trainer's constructor calls this first): vLLM replicas with
        # TLT's server, keeping rollout.name=vllm. Runs with TLT off never get here.
        from verl_tlt.integrations.vllm.replica import register_tlt_vllm_replica

        register_tlt_vllm_replica()

    return TLTRuntime(config, tlt_config)


def _build_trainer_class() -> type:
    from omegaconf import DictConfig
    from verl.trainer.ppo.v1 import PPOTrainerSync

    from verl_tlt.integrations.verl.requirements import check_requirements

    class TLTTrainerSync(PPOTrainerSync):
        """verl's sync PPO trainer plus TLT; with ``tlt.enabled=false`` it is exactly ``PPOTrainerSync``.

        Every hook runs verl's own code and calls its runtime around it: TLT's (see ``tlt_runtime``) or, with
        TLT off, :class:`DisabledTLT`, whose hooks do nothing.
        """

        def __init__(self, config: DictConfig) -> None:
            # Check before the parent builds anything (replay buffer, checkpoint callback), so a bad tlt block or
            # a run that cannot give TLT fails at construction, not later in the run.
            self.tlt_config = check_requirements(config)
            self.tlt = make_runtime(config, self.tlt_config)
            super().__init__(config)

        @property
        def trainer_mode(self) -> str:
            """Always verl's ``"sync"``: keeps every sync-only code path of ``PPOTrainer`` (see VERL_SYNC_MODE)."""
            return VERL_SYNC_MODE

        @trainer_mode.setter
        def trainer_mode(self, value: Any) -> None:
            # PPOTrainer.__init__ assigns config.trainer.v1.trainer_mode ("tlt_sync") here; the sync
            # semantics must win, and the configured name stays readable in config.trainer.v1.
            pass

        def _init_resource_pool_mgr(self) -> None:
            super()._init_resource_pool_mgr()
            self.tlt.prepare_workers(self.role_worker_mapping)

        def _load_checkpoint(self) -> None:
            super()._load_checkpoint()
            self.tlt.on_checkpoint_loaded(self.global_steps)

        def on_init_end(self) -> None:
            super().on_init_end()
            self.tlt.on_init_end(self)

        def on_sample_begin(self) -> None:
            super().on_sample_begin()
            self.tlt.on_sample_begin()

        def on_sample_end(self) -> None:
            # Free the replicas' resources from the drafter before verl sleeps them.
            self.tlt.before_sleep()
            super().on_sample_end()
            self.tlt.after_sleep()

        def on_validate_end(self) -> None:
            super().on_validate_end()
            self.tlt.after_validation()

        def _compute_old_log_prob(self, batch, metrics):
            forward = super()._compute_old_log_prob
            return (
                forward(batch, metrics) if _bypasses_log_prob(self.config) else self._captured(forward, batch, metrics)
            )

        def _update_actor(self, batch, metrics):
            # With rollout_correction.bypass_mode verl skips the log-prob pass: capture on the update's forward.
            update = super()._update_actor
            return self._captured(update, batch, metrics) if _bypasses_log_prob(self.config) else update(batch, metrics)

        def _captured(self, actor_pass, batch, metrics):
            """Run one of verl's actor passes with the hidden-state capture armed on its forward."""
            self.tlt.arm_capture(self.global_steps)
            batch = actor_pass(batch, metrics)
            self.tlt.collect_capture()
            return batch

        def on_step_end(self) -> None:
            super().on_step_end()
            self.tlt.on_step_end(self.global_steps)
            metrics = self.tlt.pop_metrics()
            if metrics:  # verl logs what is stashed here with this step (PPOTrainer._consume_sync_metrics)
                pending = getattr(self, "_pending_sync_metrics", None) or {}
                self._pending_sync_metrics = {**pending, **metrics}

        def _save_checkpoint(self) -> None:
            # The drafter's asynchronous save overlaps the actor's; both finish before the step goes on.
            self.tlt.save_checkpoint(self.global_steps)
            try:
                super()._save_checkpoint()
            finally:
                self.tlt.wait_for_save()

    TLTTrainerSync.__module__ = __name__
    TLTTrainerSync.__qualname__ = "TLTTrainerSync"
    return TLTTrainerSync


def _bypasses_log_prob(config) -> bool:
    """verl's rollout_correction.bypass_mode: no old-log-prob pass, the actor update's forward sees the batch."""
    correction = config.algorithm.get("rollout_correction", None)
    return bool(correction and correction.get("bypass_mode", False))


def __getattr__(name: str) -> Any:
    # PEP 562: `TLTTrainerSync` as a module attribute without importing verl at module import.
    if name == "TLTTrainerSync":
        return get_trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
