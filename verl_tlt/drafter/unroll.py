"""The drafter run over several draft depths at once on a packed batch, as it drafts a chain at inference.

At inference a chain from pair j drafts depth 1 from the target's feature h_j and token t_{j+1}; every deeper
level reads the drafter's own feature of the level before and the token drafted there (equal to the true token
while the chain is accepted). Trained and scored on target features only (depth 1), a drafter never sees its own
features as input, and its deeper drafts are worse than its first (the reason EAGLE-3 and HASS train on the
unrolled chain). Here depth e, for every start pair j of a packed batch at once, reads (f_{e-1}[j], t_{j+e}) at
position j+e-1 and predicts h_{j+e}, the target feature of pair j+e-1; it attends to the target-feature keys of
pairs <= j of its own sample (what the drafter's cache holds at inference) and to its own chain's keys of depths
2..e. A start whose chain would run past its sample's end is not valid at that depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl_tlt.drafter.data import PackedBatch
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.modeling.model import AttentionBatch


@dataclass
class DraftDepth:
    """One depth of the unrolled chain. features [1, N, H]: the drafter's output for every start pair j.
    target_index [N]: the pair whose target feature it predicts (j + depth - 1, clamped). valid [N] bool: that pair
    is in j's sample."""

    features: torch.Tensor
    target_index: torch.Tensor
    valid: torch.Tensor

    def loss_mask(self, pair_mask: torch.Tensor) -> torch.Tensor:
        """[1, N]: the starts whose draft at this depth is scored: the predicted pair is in the start's sample and
        `pair_mask` (the batch's [1, N] loss mask) admits it."""
        return pair_mask[:, self.target_index] & self.valid.unsqueeze(0)


def sample_ids(positions: torch.Tensor) -> torch.Tensor:
    """[N] sample number of every pair of a packed row (positions restart at 0 with every sample)."""
    return torch.cumsum(positions[0] == 0, dim=0) - 1


def sample_ranges(positions: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """(start, end) pair range of every sample of a packed row (positions [1, N] restart at 0 with every sample)."""
    starts = torch.nonzero(positions[0] == 0).flatten().tolist()
    return tuple(zip(starts, [*starts[1:], positions.shape[1]], strict=True))


def unrolled_forward(
    model: EagleDrafterModel,
    batch: PackedBatch,
    depth: int,
    input_hidden: torch.Tensor | None = None,
    *,
    segmented: bool = True,
) -> list[DraftDepth]:
    """The drafter's features at depths 1..depth for every start pair of `batch` (see the module docstring).

    segmented: attention runs sample by sample (`segmented_attention`), not over the whole packed row with its
    block-diagonal mask; the same features up to float rounding, for a fraction of the attention's work.
    """
    if depth < 1:
        raise ValueError(f"unrolled_forward needs depth >= 1, got {depth}")
    spec, num_pairs = model.spec, batch.num_pairs
    device = batch.next_token_ids.device
    hidden = batch.input_hidden if input_hidden is None else input_hidden
    index = torch.arange(num_pairs, device=device)
    samples = sample_ids(batch.positions)
    cache_shape = (1, spec.num_kv_heads, num_pairs, spec.head_dim)
    k_cache = torch.zeros(cache_shape, device=device, dtype=hidden.dtype)
    v_cache = torch.zeros_like(k_cache)
    mask = batch.attn_mask
    tokens = batch.next_token_ids
    segments = sample_ranges(batch.positions) if segmented else None
    depths: list[DraftDepth] = []
    for level in range(1, depth + 1):
        shift = level - 1
        target_index = (index + shift).clamp(max=num_pairs - 1)
        valid = (index + shift < num_pairs) & (samples[target_index] == samples)
        if level > 1:
            tokens = batch.next_token_ids[:, target_index]
            hidden = depths[-1].features
            # A fresh cache per depth (the earlier depths' keys copied in): writing into the one the previous depth's
            # attention read would break its backward.
            k_cache = torch.cat([k_cache, torch.zeros(cache_shape, device=device, dtype=k_cache.dtype)], dim=2)
            v_cache = torch.cat([v_cache, torch.zeros(cache_shape, device=device, dtype=v_cache.dtype)], dim=2)
            if level == 2:  # built only when the chain goes deeper: depth 1 is the plain training forward
                own_chain = torch.eye(num_pairs, dtype=torch.bool, device=device).view(1, 1, num_pairs, num_pairs)
            mask = torch.cat([mask, own_chain], dim=-1)
        positions = batch.positions + shift
        cos, sin = model.target.rotary_tables(positions, hidden.dtype)
        write_pos = (shift * num_pairs + index).unsqueeze(0)
        attention = AttentionBatch(
            row_start=0, write_pos=write_pos, attn_mask=mask, cos=cos, sin=sin, segments=segments, key_block=num_pairs
        )
        features = model(tokens, hidden, attention, k_cache, v_cache)
        depths.append(DraftDepth(features, target_index, valid))
    return depths
