"""Sampling seeds for verl's requests under `actor_rollout_ref.rollout.full_determinism=true`.

verl's agent loops send requests without a seed. With full determinism on, verl 0.9.1 names each request after its
sample's index in the batch (`det-<priority>`) and routes it by that name, so a request lands on the same replica
with the same name in every run of the same config and data. The torch rollout then seeds the request's keyed
sampling (`verl_tlt.spec.keyed_noise`) from the rollout seed, the replica's rollout count and that name: each sample
slot draws the same tokens in every such run, and speculative decoding changes none of them, so a run with TLT on
samples exactly the responses of the same run with TLT off.

The rollout count is the number of times verl put the replica to sleep. verl validates without sleeping the
replicas, so a validation's requests share the count of the training rollout after them: the same sample slot of
the two draws with the same noise, on different prompts (each is still an exact draw from its own distribution).
"""

from __future__ import annotations

import hashlib

DETERMINISTIC_PREFIX = "det-"  # verl's request ids under full_determinism


def deterministic_seed(base_seed: int, rollout: int, request_id: str) -> int | None:
    """A 64-bit seed for a request of rollout number `rollout`, or None when `request_id` is not a deterministic
    (full_determinism) id."""
    if not request_id.startswith(DETERMINISTIC_PREFIX):
        return None
    material = f"{int(base_seed)}/{int(rollout)}/{request_id}".encode()
    return int.from_bytes(hashlib.blake2b(material, digest_size=8).digest(), "little")
