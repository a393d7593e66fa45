from __future__ import annotations

import torch

from verl_tlt.spec import process_logits


def run(logits, temperature=1.0, top_k=-1, top_p=1.0):
    n = logits.shape[0]
    return process_logits(
        logits, torch.full((n,), temperature), torch.full((n,), top_k, dtype=torch.long), torch.full((n,), top_p)
    )


def test_temperature_scales_and_zero_means_untempered():
    logits = torch.randn(3, 11)
    assert torch.allclose(run(logits, temperature=0.5), logits * 2)
    assert torch.allclose(run(logits, temperature=0.0), logits)


def test_top_k_keeps_exactly_k_tokens():
    logits = torch.randn(4, 50)
    kept = torch.isfinite(run(logits, top_k=5)).sum(-1)
    assert kept.tolist() == [5, 5, 5, 5]


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isfinite(run(logits, top_p=0.8)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(run(logits, top_p=0.81)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(run(logits, top_p=0.1)).tolist() == [[True, False, False, False]]


def test_rows_use_their_own_parameters():
    logits = torch.randn(2, 20)
    out = process_logits(logits, torch.tensor([1.0, 2.0]), torch.tensor([3, -1]), torch.tensor([1.0, 1.0]))
    assert torch.isfinite(out[0]).sum() == 3 and torch.isfinite(out[1]).all()
    assert torch.allclose(out[1], logits[1] / 2)


def test_logits_params_process_equals_process_logits_with_and_without_filters():
    from verl_tlt.spec import LogitsParams

    logits = torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(0)) * 3
    for top_k, top_p in (([-1, -1, -1], [1.0, 1.0, 1.0]), ([-1, 3, -1], [1.0, 1.0, 0.7])):
        params = LogitsParams.from_lists([0.0, 0.7, 1.3], top_k, top_p)
        for batch in (logits[:, 0], logits):  # [B, V] and [B, M, V]
            flat = batch.reshape(-1, 11)
            positions = flat.shape[0] // 3
            expected = process_logits(
                flat,
                params.temperature.repeat_interleave(positions),
                params.top_k.repeat_interleave(positions),
                params.top_p.repeat_interleave(positions),
            )
            assert torch.equal(params.process(batch).reshape(-1, 11), expected)


def test_rows_that_divide_by_one_are_processed_without_a_division_and_equal_it():
    from verl_tlt.spec import LogitsParams

    logits = torch.randn(2, 3, 50) * 4
    logits[0, 0, :5] = float("-inf")
    for temperatures in ([0.0, 0.0], [0.0, 1.0]):
        params = LogitsParams.from_lists(temperatures, [-1, -1], [1.0, 1.0])
        for batch in (logits[:, 0], logits):
            divided = batch / params.temperature.clamp(min=1.0).view(-1, *[1] * (batch.dim() - 1))
            assert torch.equal(params.process(batch), divided)


def test_first_argmax_is_argmax_with_ties_nan_and_masked_rows():
    from verl_tlt.spec.logits import first_argmax

    for dtype in (torch.float32, torch.bfloat16):
        values = torch.randint(0, 4, (6, 2, 40)).to(dtype)  # many ties
        values[0, 0] = float("-inf")
        values[1, 1, 7] = float("nan")
        values[2, 0, 3] = values[2, 0, 30] = float("inf")
        assert torch.equal(first_argmax(values), values.argmax(dim=-1))
