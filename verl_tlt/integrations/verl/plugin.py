"""verl.plugins entry point: registers verl-tlt's components in every process that imports verl.

verl loads this module on `import verl` (driver, TaskRunner, every Ray worker) and swallows import errors at
DEBUG level, so this module logs its own outcome at WARNING on failure and never raises. It stays light: the
heavy modules (Ray actors, the engine) are named by dotted path and imported by verl only when used.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("verl_tlt")

TORCH_ROLLOUT_NAME = "torch"
REGISTERED: list[str] = []


def _load_torch_replica():
    from verl_tlt.integrations.verl.torch_replica import TorchReplica

    return TorchReplica


def register() -> None:
    """Register the CPU platform, the torch rollout backend and the TLT trainer mode (idempotent)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from verl_tlt.integrations.verl.cpu_platform import register_cpu_platform
    from verl_tlt.integrations.verl.trainer_mode import register_trainer_mode

    register_cpu_platform()
    _ROLLOUT_REGISTRY[(TORCH_ROLLOUT_NAME, "async")] = "verl_tlt.integrations.verl.torch_adapter.TorchServerAdapter"
    RolloutReplicaRegistry.register(TORCH_ROLLOUT_NAME, _load_torch_replica)
    register_trainer_mode()
    REGISTERED[:] = ["platform:cpu", f"rollout:{TORCH_ROLLOUT_NAME}", "trainer_mode:tlt_sync"]


try:
    register()
    logger.info("verl-tlt registered: %s", ", ".join(REGISTERED))
except Exception:  # verl would hide this at DEBUG level; make it visible
    logger.warning("verl-tlt failed to register its verl components; rollout.name=torch and TLT are unavailable",
                   exc_info=True)
