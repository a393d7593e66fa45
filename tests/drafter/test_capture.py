"""Capture: windows drawn toward the speculating tail within a token budget; padded and packed verl rows become
aligned samples."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.drafter.capture import (
    CaptureWindows,
    choose_windows_for_capture,
    samples_from_batch,
    samples_from_packed,
    speculation_start,
)


def test_speculation_starts_where_at_most_sd_batch_responses_still_run():
    assert speculation_start([100, 80, 50, 20], sd_batch=2) == 50  # from 50 on only 100 and 80 decode
    assert speculation_start([100, 80, 50, 20], sd_batch=4) == 0  # the whole rollout speculates
    assert speculation_start([100, 80, 50, 20], sd_batch=0) == 100


def test_windows_fit_the_budget_and_are_reproducible_per_step():
    responses, totals = [900, 300, 50, 0, 700], [1000, 400, 150, 100, 800]
    windows = CaptureWindows(window_tokens=128, tail_weight=8.0, sd_batch=2)
    chosen = choose_windows_for_capture(responses, totals, 1000, windows, seed=3)
    assert sum(end - start for _, start, end in chosen) <= 1000
    assert chosen == choose_windows_for_capture(responses, totals, 1000, windows, seed=3)  # every SP rank alike
    assert chosen != choose_windows_for_capture(responses, totals, 1000, windows, seed=4)
    assert all(row != 3 for row, _, _ in chosen)  # no response, nothing to capture
    assert chosen == sorted(chosen)
    for row, start, _ in chosen:  # a window with the prompt, or with the token before its first response token
        prompt = totals[row] - responses[row]
        assert start == 0 or (start >= prompt and (start - prompt + 1) % 128 == 0)
    everything = choose_windows_for_capture(responses, totals, 10**6, windows)
    assert everything == [(0, 0, 1000), (1, 0, 400), (2, 0, 150), (4, 0, 800)]  # adjacent windows merge


def test_the_window_sampler_reaches_late_positions_and_weights_the_speculating_tail():
    """A per-rank budget far below the long tail's lengths: a longest-first prefix would never see position 4096 of
    an 8k response, the part of the rollout that decodes with speculation on."""
    responses = [8000, 6000] + [300] * 30
    totals = [r + 100 for r in responses]
    tail_from = speculation_start(responses, 2)
    assert tail_from == 300

    def tail_share(weight: float) -> tuple[float, int]:
        """Share of the budget spent on positions decoded with speculation on, and draws reaching position 4096."""
        tail = late = 0
        for seed in range(40):
            chosen = choose_windows_for_capture(responses, totals, 2048, CaptureWindows(512, weight, 2), seed=seed)
            assert sum(end - start for _, start, end in chosen) <= 2048
            late += any(row == 0 and start > 100 + 4096 for row, start, _ in chosen)
            tail += sum(max(0, end - max(start, 100 + tail_from)) for row, start, end in chosen if row < 2)
        return tail / (40 * 2048), late

    weighted, late = tail_share(8.0)
    uniform, _ = tail_share(1.0)
    assert late >= 10  # the late part of the longest response is reached in a quarter of the steps or more
    # Uniform over response positions spends about half of the budget (prompts and lead-in tokens included) on the
    # tail's positions; weighted 8:1, three quarters (measured 0.54 and 0.77 over these 40 seeds).
    assert uniform < 0.6 and weighted > 0.7


def test_capture_rejects_inconsistent_input():
    with pytest.raises(ValueError, match="response lengths"):
        choose_windows_for_capture([1, 2], [3], token_budget=10)
    with pytest.raises(ValueError, match="token_budget"):
        choose_windows_for_capture([1], [2], token_budget=0)


def test_samples_from_a_padded_batch_keep_tokens_and_hidden_states_together():
    input_ids = torch.tensor([[0, 11, 12, 21, 22, 0], [13, 14, 15, 23, 0, 0]])
    attention = (input_ids != 0).long()
    response = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 0, 0]])
    hidden = input_ids.float().unsqueeze(-1).repeat(1, 1, 3)
    (second,) = samples_from_batch(input_ids, attention, response, hidden, rows=[1], step=7)
    assert second.token_ids.tolist() == [13, 14, 15, 23] and second.step == 7
    assert second.hidden_states[:, 0].tolist() == [13, 14, 15, 23]
    assert second.response_mask.tolist() == [False, False, False, True]


def packed_batch():
    """Three sequences back to back (5, 3 and 4 tokens); each hidden state holds its token id, twice."""
    token_values = torch.tensor([11, 12, 13, 21, 22, 31, 32, 33, 41, 42, 43, 44])
    offsets = [0, 5, 8, 12]
    hidden = token_values.float().unsqueeze(-1).repeat(1, 2)
    # Response suffixes: 2 generated tokens; 1 token; 3 tokens of which the middle one is tool output.
    responses = [torch.tensor([1, 1]), torch.tensor([1]), torch.tensor([1, 0, 1])]
    return token_values, hidden, offsets, responses


def test_samples_from_a_packed_batch_cut_each_sequence_and_place_the_response_mask_at_its_end():
    token_values, hidden, offsets, responses = packed_batch()
    first, third = samples_from_packed(token_values, hidden, offsets, responses, [(0, 0, 5), (2, 0, 4)], step=4)
    assert first.token_ids.tolist() == [11, 12, 13, 21, 22] and first.step == 4
    assert first.hidden_states[:, 1].tolist() == [11, 12, 13, 21, 22]
    assert first.response_mask.tolist() == [False, False, False, True, True]
    assert third.token_ids.tolist() == [41, 42, 43, 44]
    assert third.hidden_states[:, 0].tolist() == [41, 42, 43, 44]
    assert third.response_mask.tolist() == [False, True, False, True]
    assert samples_from_packed(token_values, hidden, offsets, responses, [], step=0) == []
    (window,) = samples_from_packed(token_values, hidden, offsets, responses, [(2, 1, 3)], step=0)
    assert window.token_ids.tolist() == [42, 43] and window.response_mask.tolist() == [True, False]


def test_packed_samples_are_long_cpu_copies_and_a_static_pad_after_the_tokens_is_ignored():
    token_values, hidden, offsets, responses = packed_batch()
    padded_hidden = torch.cat([hidden, torch.full((3, 2), -1.0)])  # e.g. padding for sequence parallelism
    (middle,) = samples_from_packed(token_values.int(), padded_hidden, offsets, responses, [(1, 0, 3)], step=0)
    assert middle.token_ids.dtype == torch.long and middle.token_ids.tolist() == [31, 32, 33]
    assert middle.hidden_states[:, 0].tolist() == [31, 32, 33]
    assert middle.response_mask.tolist() == [False, False, True]
    padded_hidden.zero_()  # the sample does not share memory with the batch
    assert middle.hidden_states[:, 0].tolist() == [31, 32, 33]


def test_packed_capture_rejects_inconsistent_input():
    token_values, hidden, offsets, responses = packed_batch()
    with pytest.raises(ValueError, match="11 hidden states for 12 tokens"):
        samples_from_packed(token_values, hidden[:-1], offsets, responses, [(0, 0, 5)], step=0)
    too_long = [responses[0], torch.ones(4), responses[2]]
    with pytest.raises(ValueError, match="row 1: response mask of 4 for a sequence of 3 tokens"):
        samples_from_packed(token_values, hidden, offsets, too_long, [(1, 0, 3)], step=0)
    with pytest.raises(ValueError, match=r"row 0: window \[2, 9\) outside its 5 tokens"):
        samples_from_packed(token_values, hidden, offsets, responses, [(0, 2, 9)], step=0)
