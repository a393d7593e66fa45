"""Sampling seeds for verl's rollout requests from their sample slot, so that sampled runs are reproducible.

verl's agent loops send requests without a seed, and route them by load, so the order in which requests reach a
replica, and which replica, varies from run to run. The `slot_seeded_single_turn_agent` agent loop
(slot_seeded_agent_loop) gives each request a seed derived from its slot: the rollout seed, the training step, the
prompt's dataset index, the sample's number within its group and the prompt's tokens (`slot_seed`). The torch
rollout's keyed sampling (`verl_tlt.spec.keyed_noise`) then draws the same tokens for a slot in every run of the same
config and data, whichever replica serves it, and speculative decoding changes none of them. vLLM honours
per-request seeds too (reproducible, though its speculative sampling consumes random draws of its own).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

# The agent loop that seeds requests from their slots (registered with verl by the plugin; slot_seeded_agent_loop).
SLOT_AGENT_LOOP = "slot_seeded_single_turn_agent"
# The generate() keyword that carries a request's GRPO group to the torch rollout server (group drafts).
GROUP_KWARG = "tlt_group"


def rollout_seed(rollout_config: Any) -> int:
    """`actor_rollout_ref.rollout.seed` (verl's RolloutConfig or a plain mapping); unset or null means 0."""
    value = rollout_config.get("seed") if hasattr(rollout_config, "get") else getattr(rollout_config, "seed", None)
    return int(value or 0)


def slot_name(global_step: Any, index: Any, session_id: Any, priority: Any = None) -> str | None:
    """The name of a sample slot, or None without a dataset index.

    verl's V1 trainers spawn a group's samples from one prompt with session ids 0..n-1; its classic agent loop
    repeats the prompt rows instead, giving each sample its own batch position (`priority`)."""
    if index is None:
        return None
    member = f"s{int(session_id)}" if session_id is not None else f"p{int(priority or 0)}"
    return f"{int(global_step or 0)}/{int(index)}/{member}"


def group_name(global_step: Any, index: Any) -> str | None:
    """The GRPO group of a sample slot: the samples of one dataset prompt at one training step (None without an
    index). Its siblings share it whatever their member number."""
    if index is None:
        return None
    return f"{int(global_step or 0)}/{int(index)}"


def slot_seed(base_seed: int, slot: str, prompt_ids: Sequence[int]) -> int:
    """A 63-bit sampling seed for a request of `slot` (from `slot_name`) with `prompt_ids`."""
    header = f"{int(base_seed)}/{slot}/".encode()
    prompt = b",".join(str(int(token)).encode() for token in prompt_ids)
    return int.from_bytes(hashlib.blake2b(header + prompt, digest_size=8).digest(), "little") >> 1
