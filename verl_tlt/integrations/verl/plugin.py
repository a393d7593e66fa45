"""verl.plugins entry point: registers verl-tlt's components in every process that imports verl.

verl loads this module on `import verl` (driver, TaskRunner, every Ray worker) and swallows import errors at
DEBUG level, so this module logs failures itself at WARNING and never raises. It stays light: each
registration runs when verl first imports the module holding that registry (see import_hooks), so processes
that never build a rollout or a trainer never pay for those imports.
"""

from __future__ import annotations

import logging
from types import ModuleType

from verl_tlt.integrations.verl.mode_selection import TLT_TRAINER_MODE
from verl_tlt.integrations.verl.requirements import TORCH_ROLLOUT_NAME

logger = logging.getLogger("verl_tlt")

TORCH_ADAPTER_PATH = "verl_tlt.integrations.torch_rollout.adapter.TorchServerAdapter"
REGISTERED: list[str] = []


def _load_torch_replica():
    from verl_tlt.integrations.torch_rollout.replica import TorchReplica

    return TorchReplica


def _register_rollout_adapter(base: ModuleType) -> None:
    base._ROLLOUT_REGISTRY[(TORCH_ROLLOUT_NAME, "async")] = TORCH_ADAPTER_PATH
    REGISTERED.append(f"rollout adapter:{TORCH_ROLLOUT_NAME}")


def _register_rollout_replica(replica: ModuleType) -> None:
    replica.RolloutReplicaRegistry.register(TORCH_ROLLOUT_NAME, _load_torch_replica)
    REGISTERED.append(f"rollout replica:{TORCH_ROLLOUT_NAME}")


def _register_trainer_mode(_: ModuleType) -> None:
    from verl_tlt.integrations.verl.trainer_mode import register_trainer_mode

    register_trainer_mode()
    REGISTERED.append(f"trainer mode:{TLT_TRAINER_MODE}")


def _register_agent_loop(_: ModuleType) -> None:
    from verl_tlt.integrations.verl.slot_seeded_agent_loop import SLOT_AGENT_LOOP  # importing it registers it

    REGISTERED.append(f"agent loop:{SLOT_AGENT_LOOP}")


def _guarded(what: str, callback):
    def run(module: ModuleType) -> None:
        try:
            callback(module)
        except Exception:  # never break verl's own import; say loudly what is missing instead
            logger.warning("verl-tlt could not register its %s with verl", what, exc_info=True)

    return run


def register() -> None:
    """Register the CPU platform now and the rollout backend / trainer mode when verl loads their registries."""
    from verl_tlt.integrations.verl.cpu_platform import register_cpu_platform
    from verl_tlt.integrations.verl.import_hooks import when_imported

    register_cpu_platform()
    REGISTERED.append("platform:cpu")
    when_imported("verl.workers.rollout.base", _guarded("torch rollout adapter", _register_rollout_adapter))
    when_imported("verl.workers.rollout.replica", _guarded("torch rollout replica", _register_rollout_replica))
    when_imported("verl.trainer.ppo.v1", _guarded(f"{TLT_TRAINER_MODE} trainer mode", _register_trainer_mode))
    when_imported(
        "verl.experimental.agent_loop.single_turn_agent_loop",
        _guarded("slot-seeded agent loop", _register_agent_loop),
    )


try:
    register()
    # WARNING on purpose: verl's logging default hides INFO, and a user must be able to see the plugin loaded.
    logger.warning(
        "verl-tlt plugin loaded: cpu platform registered; %s rollout and %s trainer mode register when verl loads them",
        TORCH_ROLLOUT_NAME,
        TLT_TRAINER_MODE,
    )
except Exception:  # verl would hide this at DEBUG level; make it visible
    logger.warning(
        "verl-tlt failed to register with verl; rollout.name=%s and TLT are unavailable",
        TORCH_ROLLOUT_NAME,
        exc_info=True,
    )
