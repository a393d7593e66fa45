"""verl BaseRollout adapter for the torch engine: runs inside the trainer worker and pushes actor weights."""

from __future__ import annotations

import logging
import os
from collections.abc import Generator

import ray
import torch
from verl.workers.rollout.base import BaseRollout

from verl_tlt.integrations.torch_rollout.replica import server_actor_name

logger = logging.getLogger(__name__)


class TorchServerAdapter(BaseRollout):
    def __init__(self, config, model_config, device_mesh, *args, replica_rank: int = -1, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.is_leader = rank % rollout_world_size == 0
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        if self.config.free_cache_engine and self.is_leader:
            await self._server_handle().wake_up.remote(tags=tags)

    async def release(self) -> None:
        if self.config.free_cache_engine and self.is_leader:
            await self._server_handle().sleep.remote()

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        wire_format: str = "named_tensors",
        global_steps: int | None = None,
        **kwargs,
    ) -> None:
        if wire_format != "named_tensors":
            raise ValueError(
                f"The torch rollout accepts full weights only (wire_format='named_tensors'), got {wire_format!r}; "
                "set actor_rollout_ref.rollout.checkpoint_engine.backend=naive"
            )
        if kwargs.get("peft_config") is not None:
            raise ValueError(
                "The torch rollout does not load LoRA adapters; set actor_rollout_ref.model.lora.merge=true"
            )
        # Every rank must walk the generator (full_tensor() is a collective); only the leader sends.
        tensors = []
        for name, tensor in weights:
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            if self.is_leader:
                tensors.append((name, tensor.detach().to("cpu", copy=True)))
        if self.is_leader:
            server = self._server_handle()
            await server.update_weights.remote(tensors, global_steps)
