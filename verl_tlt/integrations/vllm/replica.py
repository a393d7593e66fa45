"""TLT's vLLM replica: verl's ``vLLMReplica`` with TLT's server class; selected only when TLT is on.

``register_tlt_vllm_replica`` replaces the ``vllm`` entry of verl's replica registry in the process that builds
the rollout servers (the TLT trainer calls it before verl creates its server manager), so the rollout keeps
``rollout.name=vllm``, its actor names (``vllm_server_<replica>_<node>``) and every stock code path. Runs with TLT
off never call it.
"""

from __future__ import annotations

from typing import Any

ROLLOUT_NAME = "vllm"


def _load_tlt_vllm_replica() -> type:
    import ray
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    from verl_tlt.integrations.vllm.server import TLTvLLMHttpServer

    class TLTvLLMReplica(vLLMReplica):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            if not (self.is_reward_model or self.is_teacher_model):  # a reward/teacher model has no TLT drafter
                self.server_class = ray.remote(TLTvLLMHttpServer)

    return TLTvLLMReplica


def register_tlt_vllm_replica() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_tlt_vllm_replica)
