"""Sampling seeds for verl requests named after their sample slot, so that sampled runs are reproducible.

verl's agent loops send requests without a seed, under random ids, and route them by load, so the order in which
requests reach a replica, and which replica, varies from run to run. The `slot_seeded_single_turn_agent` agent loop
(slot_seeded_agent_loop) names each request after its slot instead: the prompt's dataset index and the sample's
number within its group (`slot_request_id`). The torch rollout seeds the request's keyed sampling
(`verl_tlt.spec.keyed_noise`) from that name, the replica's rollout count and the prompt's tokens
(`slot_seed`). Replicas count rollouts alike (each is put to sleep after every training rollout), so a slot draws
the same tokens in every run of the same config and data, whichever replica serves it.

verl validates without sleeping the replicas, so a validation's requests share the count of the training rollout
after them; their prompts differ, and the prompt is part of the seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

SLOT_PREFIX = "tlt-slot-"
# The agent loop that names requests after their slots (registered with verl by the plugin; slot_seeded_agent_loop).
SLOT_AGENT_LOOP = "slot_seeded_single_turn_agent"


def slot_request_id(index: Any, session_id: Any, priority: Any = None) -> str | None:
    """The request id naming a sample slot, or None without a dataset index.

    verl's V1 trainers spawn a group's samples from one prompt with session ids 0..n-1; its classic agent loop
    repeats the prompt rows instead, giving each sample its own batch position (`priority`)."""
    if index is None:
        return None
    member = f"s{int(session_id)}" if session_id is not None else f"p{int(priority or 0)}"
    return f"{SLOT_PREFIX}{int(index)}-{member}"


def slot_seed(base_seed: int, rollout: int, request_id: str, prompt_ids: Sequence[int]) -> int | None:
    """A 64-bit sampling seed for a slot-named request, or None for any other request id."""
    if not request_id.startswith(SLOT_PREFIX):
        return None
    header = f"{int(base_seed)}/{int(rollout)}/{request_id}/".encode()
    prompt = b",".join(str(int(token)).encode() for token in prompt_ids)
    return int.from_bytes(hashlib.blake2b(header + prompt, digest_size=8).digest(), "little")
