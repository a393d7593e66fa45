"""verl's single-turn agent loop with requests named after their sample slot, for reproducible sampled rollouts.

verl names a request with a random id and routes it by load, so the torch rollout cannot tell which sample of which
prompt a request is. This agent loop (`actor_rollout_ref.rollout.agent.default_agent_loop=
slot_seeded_single_turn_agent`) is verl's `single_turn_agent` with one change: the request id names the slot, the
prompt's dataset index and the sample's number within its group (`slot_request_id`). The torch rollout seeds the
request's keyed sampling from that name, its rollout count and the prompt (`request_seeds`), so every slot draws the
same tokens in every run of the same config and data, on whichever replica it lands, and speculative decoding
changes none of them: a run with TLT on samples exactly what the same run with TLT off samples.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from verl_tlt.integrations.verl.request_seeds import SLOT_AGENT_LOOP, slot_request_id

AGENT_LOOP_NAME = SLOT_AGENT_LOOP


class _SlotNamedRequests:
    """The agent loop's server manager, with the request id of `generate` replaced by the slot's name."""

    def __init__(self, server_manager: Any, request_id: str):
        self._server_manager, self._request_id = server_manager, request_id

    async def generate(self, *, request_id: str, **kwargs: Any) -> Any:
        return await self._server_manager.generate(request_id=self._request_id, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server_manager, name)


@register(AGENT_LOOP_NAME)
class SlotSeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any):
        request_id = slot_request_id(kwargs.get("index"), kwargs.get("session_id"), kwargs.get("priority"))
        if request_id is not None:  # an agent loop instance serves one sample
            self.server_manager = _SlotNamedRequests(self.server_manager, request_id)
        return await super().run(sampling_params, **kwargs)
