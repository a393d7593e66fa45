"""Seeds for verl's deterministic request ids: a function of (rollout seed, rollout count, request id) only."""

from __future__ import annotations

from verl_tlt.integrations.verl.request_seeds import deterministic_seed


def test_deterministic_ids_get_stable_distinct_64_bit_seeds():
    seeds = {deterministic_seed(0, rollout, f"det-{slot}") for rollout in range(3) for slot in range(100)}
    assert len(seeds) == 300 and all(0 <= seed < 2**64 for seed in seeds)
    assert deterministic_seed(0, 1, "det-7") == deterministic_seed(0, 1, "det-7")
    assert deterministic_seed(1, 1, "det-7") != deterministic_seed(0, 1, "det-7")


def test_random_request_ids_get_no_seed():
    assert deterministic_seed(0, 0, "3f2a9c0d4e5b6a7f8091a2b3c4d5e6f7") is None
