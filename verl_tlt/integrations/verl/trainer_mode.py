"""The ``tlt_sync`` V1 trainer mode: verl's ``PPOTrainerSync`` that reads and checks the ``tlt`` block.

verl picks the trainer class from ``TRAINER_REGISTRY`` by ``trainer.v1.trainer_mode``; a name cannot be
re-registered to another class, so TLT adds a new mode instead of replacing ``sync``. ``+tlt=on`` (stock
entry point) and ``verl_tlt.main_ppo`` with ``tlt.enabled=true`` select it.

Importing this module is cheap: verl is imported only inside :func:`register_trainer_mode` /
:func:`get_trainer_class`. The class is reachable as ``verl_tlt.integrations.verl.trainer_mode.TLTTrainerSync``
(built on first access) so that pickle finds it by reference.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from verl_tlt.config import ROOT_KEY, TLTConfig, check_available

logger = logging.getLogger(__name__)

# The value of trainer.v1.trainer_mode that selects the TLT trainer.
TLT_TRAINER_MODE = "tlt_sync"

# verl's PPOTrainer branches on the literal string `self.trainer_mode == "sync"` (replay buffer class,
# dataloader refill, TransferQueue checkpointing, prompt submission; trainer_base.py:153,731,902,912,1004,
# 1499 in 0.9.1): there is no seam to declare a new mode synchronous, so the TLT trainer reports this one.
_VERL_SYNC_MODE = "sync"

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


def _build_trainer_class() -> type:
    from omegaconf import DictConfig
    from verl.trainer.ppo.v1 import PPOTrainerSync

    class TLTTrainerSync(PPOTrainerSync):
        """verl's sync PPO trainer plus TLT; with ``tlt.enabled=false`` it is exactly ``PPOTrainerSync``.

        With TLT on, every hook runs verl's own code and adds TLT's work around it (see ``tlt_runtime``).
        """

        def __init__(self, config: DictConfig) -> None:
            # Validate before the parent builds anything (replay buffer, checkpoint callback), so a bad
            # tlt block fails at construction with the config error, not later in the run.
            self.tlt_config = TLTConfig.from_dict(config.get(ROOT_KEY), prefix=ROOT_KEY)
            check_available(self.tlt_config, config)
            self.tlt = None
            if self.tlt_config.enabled:
                from verl_tlt.integrations.verl.tlt_runtime import TLTRuntime

                self.tlt = TLTRuntime(config, self.tlt_config)
            super().__init__(config)

        @property
        def trainer_mode(self) -> str:
            """Always verl's ``"sync"``: keeps every sync-only code path of ``PPOTrainer`` (see module note)."""
            return _VERL_SYNC_MODE

        @trainer_mode.setter
        def trainer_mode(self, value: Any) -> None:
            # PPOTrainer.__init__ assigns config.trainer.v1.trainer_mode ("tlt_sync") here; the sync
            # semantics must win, and the configured name stays readable in config.trainer.v1.
            pass

        def _init_resource_pool_mgr(self) -> None:
            super()._init_resource_pool_mgr()
            if self.tlt is not None:
                _use_capture_worker(self.role_worker_mapping)

        def _load_checkpoint(self) -> None:
            super()._load_checkpoint()
            if self.tlt is not None and self.global_steps > 0:
                self.tlt.resume_dir = Path(_resumed_folder(self.config, self.global_steps))

        def on_init_end(self) -> None:
            super().on_init_end()
            if self.tlt is not None:
                from verl.utils.fs import copy_to_local

                target = copy_to_local(self.config.actor_rollout_ref.model.path)
                self.tlt.setup(self.llm_server_manager.get_replicas(), self.actor_rollout_wg, target)

        def on_sample_begin(self) -> None:
            super().on_sample_begin()
            if self.tlt is not None:
                self.tlt.on_sample_begin()

        def on_sample_end(self) -> None:
            if self.tlt is None:
                return super().on_sample_end()
            # Free the replicas' resources from the drafter before verl sleeps them.
            self.tlt.before_sleep()
            super().on_sample_end()
            self.tlt.after_sleep()

        def on_validate_end(self) -> None:
            super().on_validate_end()
            if self.tlt is not None:
                self.tlt.after_validation()

        def _compute_old_log_prob(self, batch, metrics):
            if self.tlt is None or _bypasses_log_prob(self.config):
                return super()._compute_old_log_prob(batch, metrics)
            self.tlt.arm_capture(self.global_steps)
            batch = super()._compute_old_log_prob(batch, metrics)
            self.tlt.collect_capture()
            return batch

        def _update_actor(self, batch, metrics):
            if self.tlt is None or not _bypasses_log_prob(self.config):
                return super()._update_actor(batch, metrics)
            # verl skipped the log-prob pass (rollout_correction.bypass_mode): capture on the update's forward.
            self.tlt.arm_capture(self.global_steps)
            batch = super()._update_actor(batch, metrics)
            self.tlt.collect_capture()
            return batch

        def on_step_end(self) -> None:
            super().on_step_end()
            if self.tlt is not None:
                self.tlt.on_step_end(self.global_steps)
                pending = getattr(self, "_pending_sync_metrics", None) or {}
                self._pending_sync_metrics = {**pending, **self.tlt.pop_metrics()}

        def _save_checkpoint(self) -> None:
            if self.tlt is None:
                return super()._save_checkpoint()
            # The drafter's asynchronous save overlaps the actor's; both finish before the step goes on.
            self.tlt.save(_step_folder(self.config, self.global_steps))
            try:
                super()._save_checkpoint()
            finally:
                self.tlt.wait_for_save()

    TLTTrainerSync.__module__ = __name__
    TLTTrainerSync.__qualname__ = "TLTTrainerSync"
    return TLTTrainerSync


def _use_capture_worker(role_worker_mapping: dict) -> None:
    """Swap verl's hard-coded actor worker for the one with TLT's hidden-state capture."""
    import ray
    from verl.trainer.ppo.utils import Role

    from verl_tlt.integrations.verl.capture_worker import TLTActorRolloutRefWorker

    for role in (Role.ActorRolloutRef, Role.ActorRollout, Role.Actor):
        if role in role_worker_mapping:
            role_worker_mapping[role] = ray.remote(TLTActorRolloutRefWorker)
            return
    raise RuntimeError(f"TLT: no actor role among verl's workers {list(role_worker_mapping)}")


def _bypasses_log_prob(config) -> bool:
    correction = config.algorithm.get("rollout_correction", None)
    return bool(correction and correction.get("bypass_mode", False))


def _step_folder(config, step: int) -> str:
    """verl's checkpoint folder of `step` (relative default_local_dir is taken from the working directory)."""
    root = config.trainer.default_local_dir
    if not os.path.isabs(root):
        root = os.path.join(os.getcwd(), root)
    return os.path.join(root, f"global_step_{step}")


def _resumed_folder(config, step: int) -> str:
    """The folder verl's _load_checkpoint resumed from (resume_mode auto or resume_path)."""
    if config.trainer.resume_mode == "resume_path":
        folder = config.trainer.resume_from_path
        return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)
    return _step_folder(config, step)


def __getattr__(name: str) -> Any:
    # PEP 562: `TLTTrainerSync` as a module attribute without importing verl at module import.
    if name == "TLTTrainerSync":
        return get_trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
