"""Keyed Gumbel noise: exact Gumbel-max draws, a pure function of (key, position, token), independent entries."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.spec.sd_harness import chi_square_pvalue
from verl_tlt.spec import keyed_noise
from verl_tlt.spec.keyed_noise import gumbel_noise, position_seeds, request_key

PROBS = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])


def keys_for(seeds) -> np.ndarray:
    return np.array([request_key(seed) for seed in seeds], dtype=np.uint64)


def test_gumbel_max_draws_follow_the_softmax_across_keys_and_across_positions():
    logits = PROBS.log()
    across_keys = gumbel_noise(keys_for(range(20000)), np.zeros((20000, 1), dtype=np.int64), 5)[:, 0]
    across_positions = gumbel_noise(keys_for([7]), np.arange(20000)[None], 5)[0]
    for noise in (across_keys, across_positions):
        samples = (logits + noise).argmax(-1, keepdim=True)
        assert chi_square_pvalue(samples, PROBS.double(), 5) > 1e-3


def test_pairs_of_positions_are_independent():
    # Two consecutive positions of one key: the joint of their draws is the product of the marginals.
    logits = PROBS.log()
    noise = gumbel_noise(keys_for(range(20000)), np.tile(np.array([[3, 4]]), (20000, 1)), 5)
    samples = (logits + noise).argmax(-1)
    assert chi_square_pvalue(samples, torch.outer(PROBS, PROBS).flatten().double(), 5) > 1e-3


def test_the_distribution_check_catches_noise_shared_between_positions():
    logits = PROBS.log()
    noise = gumbel_noise(keys_for(range(20000)), np.zeros((20000, 2), dtype=np.int64), 5)  # position 0 twice
    samples = (logits + noise).argmax(-1)
    assert chi_square_pvalue(samples, torch.outer(PROBS, PROBS).flatten().double(), 5) < 1e-6


def test_noise_is_a_function_of_key_position_and_token_only():
    keys = keys_for([1, 2, 3])
    positions = np.array([[0, 1, 2, 3], [10, 11, 12, 13], [5, 6, 7, 8]])
    together = gumbel_noise(keys, positions, 40)
    one_at_a_time = torch.stack(
        [
            torch.cat([gumbel_noise(keys[[row]], positions[[row], [p]][:, None], 40) for p in range(4)], 1)[0]
            for row in range(3)
        ]
    )
    assert torch.equal(together, one_at_a_time)
    assert torch.equal(gumbel_noise(keys, positions, 40)[:, :, :32], gumbel_noise(keys, positions, 32))
    assert not torch.equal(together[0, 0], together[0, 1]) and not torch.equal(together[0, 0], together[1, 0])
    assert torch.isfinite(together).all()


def test_request_keys_are_63_bit_and_unrelated_for_nearby_seeds():
    keys = [request_key(seed) for seed in range(-5, 1000)]
    assert all(0 <= key < 2**63 for key in keys)
    assert len(set(keys)) == len(keys)
    assert request_key(42) == request_key(42)
    assert request_key(2**64 + 1) == request_key(1)  # the seed's low 64 bits, as a uint64 seed would be


def test_the_device_path_computes_the_same_bits_as_the_host_path():
    seeds = position_seeds(keys_for([5, 9]), np.array([[0, 1, 2], [7, 8, 9]]))
    host = keyed_noise.token_bits(seeds, 300).view(np.int64)
    on_device = keyed_noise._mix_torch(
        torch.from_numpy(seeds.view(np.int64)).unsqueeze(-1) ^ keyed_noise._vocab_salts_on(300, torch.device("cpu"))
    )
    assert np.array_equal(host, on_device.numpy())


@pytest.mark.gpu
def test_gumbel_noise_on_cuda_equals_the_host_noise():
    keys, positions = keys_for([5, 9]), np.array([[0, 1, 2], [7, 8, 9]])
    torch.testing.assert_close(gumbel_noise(keys, positions, 300, "cuda").cpu(), gumbel_noise(keys, positions, 300))
