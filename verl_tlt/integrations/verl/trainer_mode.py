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
        """verl's sync PPO trainer plus TLT; with ``tlt.enabled=false`` it is exactly ``PPOTrainerSync``."""

        def __init__(self, config: DictConfig) -> None:
            # Validate before the parent builds anything (replay buffer, checkpoint callback), so a bad
            # tlt block fails at construction with the config error, not later in the run.
            self.tlt_config = TLTConfig.from_dict(config.get(ROOT_KEY), prefix=ROOT_KEY)
            check_available(self.tlt_config)
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

    TLTTrainerSync.__module__ = __name__
    TLTTrainerSync.__qualname__ = "TLTTrainerSync"
    return TLTTrainerSync


def __getattr__(name: str) -> Any:
    # PEP 562: `TLTTrainerSync` as a module attribute without importing verl at module import.
    if name == "TLTTrainerSync":
        return get_trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
