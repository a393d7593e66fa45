"""The unrolled chain on a packed batch equals drafting the chain step by step, as inference does."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.drafter.data import DrafterSample, pack
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.drafter.trainer import drafter_forward
from verl_tlt.drafter.unroll import sample_ids, sample_ranges, unrolled_forward
from verl_tlt.modeling.model import AttentionBatch, sequence_hidden_states
from verl_tlt.modeling.weights import load_pretrained

DEPTH = 4


@pytest.fixture(scope="module")
def drafter_and_samples(varied_qwen2):
    target, _ = load_pretrained(str(varied_qwen2[0]))
    torch.manual_seed(0)
    drafter = EagleDrafterModel.from_target(target)
    with torch.no_grad():  # away from the identity start, so a wrong input or key would show
        for param in drafter.parameters():
            param.add_(0.05 * torch.randn_like(param))
    generator = torch.Generator().manual_seed(2)
    samples = []
    for length in (9, 7):
        ids = torch.randint(3, target.spec.vocab_size, (length,), generator=generator)
        samples.append(DrafterSample(ids, sequence_hidden_states(target, ids.tolist()), torch.ones(length, dtype=bool)))
    return drafter, samples


@torch.no_grad()
def chain_step_by_step(drafter: EagleDrafterModel, sample: DrafterSample, start: int, depth: int) -> list:
    """Inference order: the drafter consumes target pairs 0..start, then drafts along the true tokens, one position at
    a time, reading its own previous feature, with a cache that keeps every key written so far."""
    spec = drafter.spec
    tokens, hidden = sample.token_ids[1:], sample.hidden_states[:-1]  # pair j: (h_j, t_{j+1})
    length = start + depth
    k_cache = torch.zeros(1, spec.num_kv_heads, length, spec.head_dim)
    v_cache = torch.zeros_like(k_cache)
    positions = torch.arange(start + 1).unsqueeze(0)
    cos, sin = drafter.target.rotary_tables(positions, torch.float32)
    mask = torch.ones(start + 1, start + 1, dtype=torch.bool).tril().view(1, 1, start + 1, start + 1)
    prefix = AttentionBatch(row_start=0, write_pos=positions, attn_mask=mask, cos=cos, sin=sin)
    feature = drafter(tokens[: start + 1].unsqueeze(0), hidden[: start + 1].unsqueeze(0), prefix, k_cache, v_cache)
    features = [feature[0, -1]]
    for level in range(2, depth + 1):
        position = start + level - 1
        if position >= tokens.shape[0]:
            break
        where = torch.tensor([[position]])
        cos, sin = drafter.target.rotary_tables(where, torch.float32)
        step = AttentionBatch(row_start=0, write_pos=where, attn_mask=None, cos=cos, sin=sin, kv_len=position + 1)
        feature = drafter(tokens[position].view(1, 1), features[-1].view(1, 1, -1), step, k_cache, v_cache)
        features.append(feature[0, 0])
    return features


def test_every_depth_of_every_start_matches_step_by_step_drafting(drafter_and_samples):
    drafter, samples = drafter_and_samples
    batch = pack(samples)
    with torch.no_grad():
        depths = unrolled_forward(drafter, batch, DEPTH)
        assert torch.allclose(depths[0].features, drafter_forward(drafter, batch, batch.input_hidden), atol=1e-6)
    offsets = [0, samples[0].num_tokens - 1]  # where each sample's pairs start in the packed row
    checked = 0
    for sample, offset in zip(samples, offsets, strict=True):
        pairs = sample.num_tokens - 1
        for start in range(pairs):
            expected = chain_step_by_step(drafter, sample, start, DEPTH)
            for level, feature in enumerate(expected):
                depth = depths[level]
                assert (
                    bool(depth.valid[offset + start])
                    and int(depth.target_index[offset + start]) == offset + start + level
                )
                # Features grow with depth here (fc starts as a pass-through): fp32 rounding scales with them.
                scale = float(feature.abs().max())
                torch.testing.assert_close(depth.features[0, offset + start], feature, atol=1e-4 * scale, rtol=0)
                checked += 1
            for level in range(len(expected), DEPTH):  # the chain would leave the sample: never valid
                assert not bool(depths[level].valid[offset + start])
    assert checked > 30


def test_gradients_flow_through_every_depth(drafter_and_samples):
    drafter, samples = drafter_and_samples
    batch = pack(samples)
    depths = unrolled_forward(drafter, batch, 3)
    depths[-1].features[0, depths[-1].valid].sum().backward()
    assert drafter.fc.weight.grad is not None and float(drafter.fc.weight.grad.abs().sum()) > 0
    drafter.zero_grad(set_to_none=True)


def test_sample_ids_follow_position_restarts():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0]])
    assert sample_ids(positions).tolist() == [0, 0, 0, 1, 1, 2]


def test_sample_ranges_follow_position_restarts():
    assert sample_ranges(torch.tensor([[0, 1, 2, 0, 1, 0]])) == ((0, 3), (3, 5), (5, 6))
    assert sample_ranges(torch.tensor([[0, 1]])) == ((0, 2),)


def test_segmented_attention_matches_the_dense_masked_row_in_features_and_gradients(drafter_and_samples):
    """Sample-by-sample attention (the default) against one attention over the whole row with the block mask: the
    same features and gradients on three packed samples, through both depths (depth 2 reads two key blocks).

    Tolerances: this drafter's features grow ~10x per depth, so fp32 rounding differences in the attention's
    summation order grow with them (measured 3e-5 of the largest gradient at depth 2); attending to a wrong key
    changes results at the percent level."""
    drafter, samples = drafter_and_samples
    batch = pack([*samples, samples[0].window(2, 8)])
    results = []
    for segmented in (False, True):
        drafter.zero_grad(set_to_none=True)
        depths = unrolled_forward(drafter, batch, 2, segmented=segmented)
        sum(d.features[0, d.valid].sum() for d in depths).backward()
        results.append(([d.features.detach() for d in depths], [p.grad.clone() for p in drafter.parameters()]))
    drafter.zero_grad(set_to_none=True)
    (dense_features, dense_grads), (split_features, split_grads) = results
    for dense, split in zip(dense_features, split_features, strict=True):
        torch.testing.assert_close(split, dense, atol=1e-5 * float(dense.abs().max()), rtol=0)
    for dense, split in zip(dense_grads, split_grads, strict=True):
        torch.testing.assert_close(split, dense, atol=2e-4 * float(dense.abs().max()), rtol=0)
