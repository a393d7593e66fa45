"""The control contract between the TLT runtime and a rollout server, and its start-up check.

The runtime drives every rollout replica through the same few calls (load a drafter version, read the target's
shared weights, take the speculative-decoding counters, wait for the replica to drain, take the last rollout's
record, close a validation). Two servers implement them: the torch engine's (`torch_rollout.server`) and TLT's vLLM
server (`vllm.server`); `RolloutControl` writes the contract down and `check_rollout_servers` refuses, at start-up
and by name, a server that lacks part of it. Methods may be sync or async: the runtime calls them through Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch


class RolloutControl(Protocol):
    """What a rollout server offers the TLT runtime (besides verl's own calls: generate, sleep, wake_up, ...)."""

    def update_drafter(self, state: dict[str, torch.Tensor], version: int) -> bool:
        """Load drafter weights `version` (an EagleDrafterModel state dict) between rollouts; False if it is already
        loaded. A load that fails raises and leaves the previous drafter running."""
        ...

    def drafter_version(self) -> int | None:
        """The version loaded, or None before the first load."""
        ...

    def target_shared_weights(self) -> dict[str, torch.Tensor]:
        """The target's current embedding and LM head (transformers names, on CPU), which EAGLE drafters share."""
        ...

    def sd_stats(self, reset: bool = True) -> dict[str, Any]:
        """Plain and speculative step counters since the last call (reset=True) or since start."""
        ...

    async def wait_for_drain(self, poll_s: float = 0.01) -> float | None:
        """When the replica has served requests in the current rollout and has none left: the wall-clock time it
        drained; None when the rollout ended (sleep) first."""
        ...

    def pop_last_rollout(self) -> dict[str, Any] | None:
        """The record of the latest finished rollout (metrics.rollout_trace), once."""
        ...

    def end_validation(self) -> None:
        """Keep what verl's validation generated out of the next rollout's record and counters."""
        ...

    def accelerator_ids(self) -> list[str]:
        """The accelerator ids this replica's engine runs on, as its node's CUDA_VISIBLE_DEVICES names them (empty
        on CPU): where its drafter worker trains (``control.placement``)."""
        ...

    def cpu_cores(self) -> list[int]:
        """The CPU cores this replica's server is pinned to (empty: not pinned), where its drafter worker is pinned
        too (``control.placement``)."""
        ...

    def free_for_training(self) -> bool:
        """The replica has drained: free what the drafter's burst can use (its KV cache); True if anything was."""
        ...

    def restore_after_training(self) -> None:
        """Have back what `free_for_training` freed, before the next rollout (a request that comes first does it)."""
        ...


CONTROL_CALLS: tuple[str, ...] = tuple(
    name for name, value in vars(RolloutControl).items() if callable(value) and not name.startswith("_")
)


def check_rollout_servers(servers: Sequence[Any]) -> None:
    """Raise if there are no servers or one lacks a call of the contract (servers: Ray actor handles or objects)."""
    if not servers:
        raise RuntimeError("TLT runtime: verl started no rollout servers; TLT needs at least one rollout replica")
    for rank, server in enumerate(servers):
        missing = [name for name in CONTROL_CALLS if not hasattr(server, name)]
        if missing:
            raise RuntimeError(
                f"TLT runtime: rollout server {rank} ({_class_name(server)}) lacks {missing} of TLT's control calls. "
                "TLT drives the torch rollout (actor_rollout_ref.rollout.name=torch) and verl's vLLM rollout with "
                "TLT's server (actor_rollout_ref.rollout.name=vllm, swapped in by tlt.enabled=true); set one of them, "
                "or run with tlt.enabled=false."
            )


def _class_name(server: Any) -> str:
    # A Ray actor handle names its class in its metadata; a plain object by its type.
    meta = getattr(server, "_ray_actor_creation_function_descriptor", None)
    return getattr(meta, "class_name", None) or type(server).__name__
