"""verl RolloutReplica for the torch engine (rollout.name=torch): one TorchRolloutServer actor per replica."""

from __future__ import annotations

import asyncio

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.rollout.replica import RolloutReplica

from verl_tlt.integrations.torch_rollout.server import TorchRolloutServer

SERVER_NAME_PREFIX = "torch_"


def server_actor_name(replica_rank: int, suffix: str = "") -> str:
    """Named-actor convention shared with TorchServerAdapter (verl's vLLM uses '{name}_server_{replica}_{node}')."""
    return f"{SERVER_NAME_PREFIX}server_{replica_rank}_0{suffix}"


class TorchReplica(RolloutReplica):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.nnodes != 1 or self.world_size != 1:
            raise ValueError(
                "The torch rollout engine runs one process per replica: set "
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1 (and data/pipeline parallel size 1); "
                f"got a replica world size of {self.world_size}."
            )

    async def launch_servers(self) -> None:
        if self.workers:
            # Hybrid/colocated: put the server on the node of the trainer worker it shares resources with.
            node_id = await self.workers[0].__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
        else:
            node_id = ray.get_runtime_context().get_node_id()
        kind = "_reward" if self.is_reward_model else "_teacher" if self.is_teacher_model else ""
        name = server_actor_name(self.replica_rank, f"{kind}{self.name_suffix}")
        server = (
            ray.remote(TorchRolloutServer)
            .options(
                name=name,
                num_cpus=0,
                max_concurrency=self.max_concurrency,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            )
            .remote(
                config=self.config,
                model_config=self.model_config,
                replica_rank=self.replica_rank,
                node_slot=self.node_slot(),
            )
        )
        await server.init_engine.remote()
        self.servers = [server]
        self._server_handle = server
        # No HTTP endpoint: verl only needs a unique key per replica for its load balancer.
        self._server_address = f"torch-rollout-{name}"

    def node_slot(self) -> tuple[int, int]:
        """(this replica's index among the replicas on its node, how many there are): verl places one replica per
        `world_size` devices, `gpus_per_node` of them a node (on CPU, the cpu platform's device slots)."""
        per_node = max(1, self.gpus_per_node // self.world_size)
        return self.replica_rank % per_node, per_node

    async def sleep(self) -> None:
        await self.servers[0].wait_for_requests_to_drain.remote()
        await asyncio.gather(*[server.sleep.remote() for server in self.servers])

    def rollout_worker_use_gpu(self) -> bool:
        return False
