"""Gumbel noise keyed by (request, token position): sampling that does not depend on how a token is decoded.

argmax(processed logits + Gumbel noise) is an exact draw from softmax(processed logits) (the Gumbel-max trick). If
the noise is a function of the request's key and the token's position only, plain and speculative decoding draw the
same token at every position:
- the drafter drafts position i as argmax(its processed logits + the noise of position i), so a drafter close to
  the target guesses the target's own draw (Gumbel coupling: Daliri, Musco and Suresh, "Coupling without
  communication and drafter-invariant speculative decoding", 2024);
- the verifier computes the target's draw at every node and accepts a draft exactly when it equals that draw, then
  emits the target's draw at the first mismatch: greedy verification on the perturbed logits.
The emitted tokens are then plain decoding's tokens under the same keys, whatever the batch, the strategy or the
drafter: speculation changes speed only, and reproducing a run needs only its keys.

The noise comes from counter-based hashes (splitmix64's finaliser over key, position and token id), not a
stateful generator, so any position's noise can be computed at any time; uniforms have 52 bits. The hashes run in
numpy, whose unsigned integers wrap as the hashes need and whose per-call cost on small arrays is a fraction of
torch's; on an accelerator the per-token part runs in torch on the device (the same bits), so only the [B, P]
position seeds cross from the host.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's multipliers
_GOLDEN = 0x9E3779B97F4A7C15
_UNIFORM_BITS = 52  # of the hash's 64: (k + 0.5) / 2^52 stays below 1 in float64
_KEY_BITS = 63
_SHIFTS = (30, 27, 31)
_U64 = (1 << 64) - 1


def _as_int64(value: int) -> int:
    """The int64 with the same 64 bits as the unsigned `value` (torch has no uint64 arithmetic)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def request_key(seed: int) -> int:
    """A request's noise key from its sampling seed (any int): the seed's low 64 bits mixed (splitmix64), so nearby
    seeds give unrelated noise; 63 bits, so keys fit int64 tensors."""
    x = (seed + _GOLDEN) & _U64
    x = ((x ^ (x >> _SHIFTS[0])) * _M1) & _U64
    x = ((x ^ (x >> _SHIFTS[1])) * _M2) & _U64
    return (x ^ (x >> _SHIFTS[2])) >> (64 - _KEY_BITS)


# numpy scalars made once: building them costs about as much as a ufunc call on a small array.
_NP_SHIFTS = tuple(np.uint64(shift) for shift in _SHIFTS)
_NP_M1, _NP_M2, _NP_GOLDEN, _NP_ONE = np.uint64(_M1), np.uint64(_M2), np.uint64(_GOLDEN), np.uint64(1)
_NP_UNIFORM_SHIFT = np.uint64(64 - _UNIFORM_BITS)


def _mix_np(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (products wrap, as the hash needs), in place."""
    x ^= x >> _NP_SHIFTS[0]
    x *= _NP_M1
    x ^= x >> _NP_SHIFTS[1]
    x *= _NP_M2
    x ^= x >> _NP_SHIFTS[2]
    return x


def _mix_torch(x: torch.Tensor) -> torch.Tensor:
    """The same finaliser on int64 tensors holding the same 64 bits: products wrap alike, and each right shift is
    made logical by masking off the copied sign bits."""
    for shift, multiplier in zip(_SHIFTS, (_M1, _M2, None), strict=True):
        x = x ^ ((x >> shift) & ((1 << (64 - shift)) - 1))
        if multiplier is not None:
            x = x * _as_int64(multiplier)
    return x


def position_seeds(keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """[B, P] uint64 seeds for noise keys [B] (from `request_key`) at token positions [B, P] (>= 0)."""
    x = positions.astype(np.uint64)
    x += _NP_ONE
    x *= _NP_GOLDEN
    x += keys.astype(np.uint64, copy=False)[:, None]
    return _mix_np(x)


@functools.lru_cache(maxsize=8)
def _vocab_salts(vocab_size: int) -> np.ndarray:
    """[V] distinct pseudo-random 64-bit salts, one per token id (a bijection of the id, so no two coincide)."""
    return _mix_np(np.arange(1, vocab_size + 1, dtype=np.uint64) * _NP_GOLDEN)


@functools.lru_cache(maxsize=8)
def _vocab_salts_on(vocab_size: int, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(_vocab_salts(vocab_size).view(np.int64)).to(device)


def token_bits(seeds: np.ndarray, vocab_size: int) -> np.ndarray:
    """[B, P, V] uint64 random bits per (position seed, token id)."""
    return _mix_np(seeds[..., None] ^ _vocab_salts(vocab_size))


def gumbel_noise(
    keys: np.ndarray, positions: np.ndarray, vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[B, P, V] float32 standard Gumbel noise for rows with noise keys `keys` [B] at token positions [B, P].

    Entry (b, p, v) depends only on (keys[b], positions[b, p], v); distinct entries are independent draws (up to the
    hashes' quality). Add it to processed logits and take the argmax to sample. The top 52 bits of each hash make a
    float64 uniform in (0, 1), never 0 or 1, so the logs stay finite.
    """
    device = torch.device(device)
    seeds = position_seeds(np.asarray(keys, dtype=np.uint64), np.asarray(positions))
    if device.type == "cpu":
        bits = token_bits(seeds, vocab_size)
        bits >>= _NP_UNIFORM_SHIFT
        uniform = bits.astype(np.float64)
        uniform += 0.5
        uniform *= 2.0**-_UNIFORM_BITS
        np.log(uniform, out=uniform)
        np.negative(uniform, out=uniform)
        np.log(uniform, out=uniform)
        return torch.from_numpy(uniform.astype(np.float32)).neg_()
    bits = _mix_torch(
        torch.from_numpy(seeds.view(np.int64)).to(device).unsqueeze(-1) ^ _vocab_salts_on(vocab_size, device)
    )
    top = (bits >> (64 - _UNIFORM_BITS)) & ((1 << _UNIFORM_BITS) - 1)
    uniform = (top.to(torch.float64) + 0.5) * 2.0**-_UNIFORM_BITS
    return (-torch.log(-torch.log(uniform))).to(torch.float32)
