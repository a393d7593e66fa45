"""The drafter's fused inference forward computes EagleDrafterModel.forward, for every target architecture."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import build_tiny_model
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.engine.drafts.eagle_forward import EagleInferenceForward
from verl_tlt.modeling.model import AttentionBatch
from verl_tlt.modeling.weights import load_pretrained

KV_LEN = 12


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "llama"])
def drafter(request, tmp_path_factory) -> EagleDrafterModel:
    """A drafter for a tiny target of each architecture, every parameter moved away from its initialisation."""
    path = tmp_path_factory.mktemp(f"eagle_inference_{request.param}")
    build_tiny_model(request.param, path, weight_std=0.2)
    target, _ = load_pretrained(str(path))
    model = EagleDrafterModel.from_target(target)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
    return model.eval()


def step_inputs(model: EagleDrafterModel, rows: int, width: int, seed: int = 0):
    """Tokens, features, positions and a mask for `width` new pairs per row after different cached lengths."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.spec.vocab_size, (rows, width), generator=generator)
    hidden = torch.randn(rows, width, model.spec.hidden_size, generator=generator)
    starts = torch.tensor([KV_LEN - width - row for row in range(rows)])  # row 0 fills the cache to KV_LEN
    positions = starts.unsqueeze(1) + torch.arange(width)
    mask = (torch.arange(KV_LEN).view(1, 1, KV_LEN) <= positions.unsqueeze(-1)).unsqueeze(1)
    return tokens, hidden, positions, mask


def random_cache(model: EagleDrafterModel, rows: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    spec = model.spec
    generator = torch.Generator().manual_seed(seed)
    shape = (rows, spec.num_kv_heads, KV_LEN, spec.head_dim)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def both_forwards(model: EagleDrafterModel, fused: EagleInferenceForward, rows: int, width: int, masked: bool):
    tokens, hidden, positions, mask = step_inputs(model, rows, width)
    if not masked:
        mask = None
    cos, sin = model.target.rotary_tables(positions, torch.float32, max_position=KV_LEN)
    k_ref, v_ref = random_cache(model, rows)
    k_new, v_new = k_ref.clone(), v_ref.clone()
    batch = AttentionBatch(row_start=0, write_pos=positions, attn_mask=mask, cos=cos, sin=sin, kv_len=KV_LEN)
    with torch.inference_mode():
        expected = model(tokens, hidden, batch, k_ref, v_ref)
        actual = fused(tokens, hidden, positions, mask, KV_LEN, cos, sin, k_new, v_new)
    return (expected, k_ref, v_ref), (actual, k_new, v_new)


@pytest.mark.parametrize(("rows", "width", "masked"), [(1, 1, False), (3, 1, True), (1, 5, True), (3, 4, True)])
def test_fused_forward_equals_the_model(drafter, rows, width, masked):
    if not masked:  # without a mask, every row must attend to the whole length: one row that fills it
        width = 1
    reference, fused = both_forwards(drafter, EagleInferenceForward(drafter), rows, width, masked)
    for want, got in zip(reference, fused, strict=True):  # features, then the K and V caches it wrote
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def two_calls(drafter, rows: int, args: tuple, first: dict, second: dict):
    """The fused forward twice on the same inputs and copies of one cache, with different options:
    (features, K cache, V cache) of each."""
    fused = EagleInferenceForward(drafter)
    k_first, v_first = random_cache(drafter, rows)
    k_second, v_second = k_first.clone(), v_first.clone()
    tokens, hidden, write_pos, mask, cos, sin = args
    with torch.inference_mode():
        out_first = fused(tokens, hidden, write_pos, mask, KV_LEN, cos, sin, k_first, v_first, **first)
        out_second = fused(tokens, hidden, write_pos, mask, KV_LEN, cos, sin, k_second, v_second, **second)
    return (out_first, k_first, v_first), (out_second, k_second, v_second)


@pytest.mark.parametrize("keep", [[4], [3, 1, 2]])
def test_kept_positions_equal_the_full_forward(drafter, keep):
    """`keep` computes only one position's feature per row, and still writes every position's keys and values."""
    rows, width = len(keep), 5
    tokens, hidden, positions, mask = step_inputs(drafter, rows, width)
    cos, sin = drafter.target.rotary_tables(positions, torch.float32, max_position=KV_LEN)
    args = (tokens, hidden, positions, mask, cos, sin)
    (every, k_all, v_all), (kept, k_kept, v_kept) = two_calls(drafter, rows, args, {}, {"keep": keep})
    assert kept.shape == (rows, 1, drafter.spec.hidden_size)
    torch.testing.assert_close(kept[:, 0], every[torch.arange(rows), torch.tensor(keep)], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_kept, k_all)
    torch.testing.assert_close(v_kept, v_all)


@pytest.mark.parametrize(("rows", "width"), [(1, 5), (3, 1)])
def test_writing_by_slices_equals_writing_by_index(drafter, rows, width):
    """write_start (rows at equal, consecutive positions) fills the cache exactly as the indexed write does."""
    tokens, hidden, _, _ = step_inputs(drafter, rows, width)
    start = KV_LEN - width
    positions = (start + torch.arange(width)).expand(rows, width)
    mask = (torch.arange(KV_LEN).view(1, 1, KV_LEN) <= positions.unsqueeze(-1)).unsqueeze(1)
    cos, sin = drafter.target.rotary_tables(positions, torch.float32, max_position=KV_LEN)
    args = (tokens, hidden, positions, mask, cos, sin)
    by_index, by_slice = two_calls(drafter, rows, args, {}, {"write_start": start})
    for want, got in zip(by_index, by_slice, strict=True):
        torch.testing.assert_close(got, want)


def test_rotary_rows_are_the_tables_rows(drafter):
    cos, sin = drafter.target.rotary_rows(7, 3, torch.float32)
    want_cos, want_sin = drafter.target.rotary_tables(torch.arange(7, 10), torch.float32)
    torch.testing.assert_close(cos, want_cos)
    torch.testing.assert_close(sin, want_sin)


def test_new_weights_are_used_after_refresh(drafter):
    """refresh() rebuilds the layouts after load_state_dict and optimizer steps (versions); invalidate() after
    writes through .data, which bump no version."""
    fused = EagleInferenceForward(drafter)
    before = both_forwards(drafter, fused, 3, 4, True)[1][0]
    original = {name: value.clone() for name, value in drafter.state_dict().items()}
    try:
        changed = {name: value + 0.05 for name, value in original.items()}
        drafter.load_state_dict(changed)
        fused.refresh()
        reference, actual = both_forwards(drafter, fused, 3, 4, True)
        assert not torch.allclose(actual[0], before)
        torch.testing.assert_close(actual[0], reference[0], rtol=1e-5, atol=1e-5)

        optimizer = torch.optim.SGD(drafter.parameters(), lr=0.1)
        loss = sum((param**2).sum() for param in drafter.parameters())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        fused.refresh()
        reference, actual = both_forwards(drafter, fused, 3, 4, True)
        torch.testing.assert_close(actual[0], reference[0], rtol=1e-5, atol=1e-5)

        drafter.layer.mlp.down_proj.weight.data.mul_(2.0)  # a write that bumps no version counter
        fused.invalidate()
        reference, actual = both_forwards(drafter, fused, 3, 4, True)
        torch.testing.assert_close(actual[0], reference[0], rtol=1e-5, atol=1e-5)
    finally:
        drafter.load_state_dict(original)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_forward_equals_the_model_on_cuda(drafter, dtype):
    """The engine's SD tests on CUDA check losslessness, which holds for any drafter; this checks the drafter."""
    import copy

    model = copy.deepcopy(drafter)
    model.target.to(device="cuda", dtype=dtype)
    model.to(device="cuda", dtype=dtype)
    tokens, hidden, positions, mask = (t.cuda() for t in step_inputs(model, 3, 4))
    hidden = hidden.to(dtype)
    cos, sin = model.target.rotary_tables(positions, dtype, max_position=KV_LEN)
    spec = model.spec
    k_ref = torch.zeros(3, spec.num_kv_heads, KV_LEN, spec.head_dim, device="cuda", dtype=dtype)
    v_ref = torch.zeros_like(k_ref)
    k_new, v_new = k_ref.clone(), v_ref.clone()
    batch = AttentionBatch(row_start=0, write_pos=positions, attn_mask=mask, cos=cos, sin=sin, kv_len=KV_LEN)
    with torch.inference_mode():
        expected = model(tokens, hidden, batch, k_ref, v_ref)
        actual = EagleInferenceForward(model)(tokens, hidden, positions, mask, KV_LEN, cos, sin, k_new, v_new)
    for got, want in ((actual, expected), (k_new, k_ref)):
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        else:  # bf16 keeps 8 bits: a differently ordered sum moves single elements by an ulp; compare the whole
            error = (got.float() - want.float()).norm() / want.float().norm()
            assert error < 1e-2, error
