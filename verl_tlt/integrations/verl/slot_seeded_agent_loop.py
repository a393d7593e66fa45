"""verl's single-turn agent loop with each request seeded from its sample slot, for reproducible sampled rollouts.

`actor_rollout_ref.rollout.agent.default_agent_loop=slot_seeded_single_turn_agent` runs verl's `single_turn_agent`
with one change: the request's sampling parameters carry a seed derived from its slot (training step, the prompt's
dataset index, the sample's number in its group) and its prompt (`request_seeds`). With the torch rollout's keyed
sampling every slot then draws the same tokens in every run of the same config and data, on whichever replica it
lands, and speculative decoding changes none of them: a run with TLT on samples exactly what the same run with TLT
off samples. A request that already has a seed keeps it.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from verl_tlt.integrations.verl.requirements import TORCH_ROLLOUT_NAME, tlt_config_of
from verl_tlt.request_seeds import (
    GROUP_KWARG,
    SLOT_AGENT_LOOP,
    group_name,
    rollout_seed,
    slot_name,
    slot_seed,
)


class _SeededRequests:
    """The agent loop's server manager, with a slot seed added to the sampling parameters of `generate`, and, for
    group drafts, the request's GRPO group."""

    def __init__(self, server_manager: Any, base_seed: int, slot: str, group: str | None = None):
        self._server_manager, self._base_seed, self._slot, self._group = server_manager, base_seed, slot, group

    async def generate(self, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        if sampling_params.get("seed") is None:
            sampling_params = {**sampling_params, "seed": slot_seed(self._base_seed, self._slot, prompt_ids)}
        if self._group is not None:
            kwargs[GROUP_KWARG] = self._group
            # Siblings draft from each other only on one replica. verl's load balancer keeps a request id on the
            # replica it first chose (least loaded), so routing by the group's id sends the whole group there; the
            # server still gets a request id of its own (verl passes a fresh one, or this one with a counter).
            kwargs["request_id"] = f"tlt-group/{self._group}"
        return await self._server_manager.generate(prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server_manager, name)


@register(SLOT_AGENT_LOOP)
class SlotSeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any):
        slot = slot_name(
            _plain(kwargs.get("global_steps")),
            _plain(kwargs.get("index")),
            _plain(kwargs.get("session_id")),
            _plain(kwargs.get("priority")),
        )
        if slot is not None:  # an agent loop instance serves one sample
            base_seed = rollout_seed(self.rollout_config)
            group = None
            if _group_drafts_on(self.config):
                group = group_name(_plain(kwargs.get("global_steps")), _plain(kwargs.get("index")))
            self.server_manager = _SeededRequests(self.server_manager, base_seed, slot, group)
        return await super().run(sampling_params, **kwargs)


def _group_drafts_on(config: Any) -> bool:
    """Whether the run drafts from GRPO groups (tlt.enabled and tlt.speculative.group_drafts, torch rollout)."""
    if not hasattr(config, "get"):
        return False
    tlt = tlt_config_of(config)
    return tlt.enabled and tlt.speculative.group_drafts and config.actor_rollout_ref.rollout.name == TORCH_ROLLOUT_NAME


def _plain(value: Any) -> Any:
    """A tensor or numpy scalar from verl's batch as a Python number (None stays None)."""
    return value.item() if hasattr(value, "item") else value
