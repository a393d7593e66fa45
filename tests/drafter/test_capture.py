"""Capture: long responses first within a token budget; padded and packed verl rows become aligned samples."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.drafter.capture import choose_rows_for_capture, samples_from_batch, samples_from_packed, truncated
from verl_tlt.drafter.data import DrafterSample


def test_longest_responses_are_captured_first_within_the_budget():
    responses = [10, 300, 50, 300, 0, 900]
    totals = [20, 310, 60, 310, 10, 910]
    # The longest (910 tokens) does not fit 700: its 700-token prefix (690 response tokens) takes the budget.
    assert choose_rows_for_capture(responses, totals, token_budget=700) == [(5, 700)]
    assert choose_rows_for_capture(responses, totals, token_budget=2000) == [
        (0, 20),
        (1, 310),
        (2, 60),
        (3, 310),
        (5, 910),
    ]
    assert choose_rows_for_capture(responses, totals, token_budget=5) == []


def test_a_response_longer_than_the_budget_is_captured_as_a_prefix_not_skipped():
    """A per-rank budget below the long tail's lengths must not leave the drafter only the short answers."""
    responses, totals = [8000, 6000, 300, 200], [8100, 6100, 400, 300]
    assert choose_rows_for_capture(responses, totals, token_budget=4096) == [(0, 4096)]
    # A prefix with fewer than PREFIX_MIN_RESPONSE_TOKENS response tokens is not worth it: the next rows fit whole.
    assert choose_rows_for_capture([500, 30], [590, 40], token_budget=150) == [(1, 40)]


def test_truncated_keeps_the_prefix_of_every_field():
    sample = DrafterSample(torch.arange(6), torch.arange(12.0).view(6, 2), torch.tensor([0, 0, 1, 1, 1, 1]).bool(), 3)
    short = truncated(sample, 4)
    assert short.token_ids.tolist() == [0, 1, 2, 3] and short.hidden_states.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert short.response_mask.tolist() == [False, False, True, True] and short.step == 3
    assert truncated(sample, 10) is sample


def test_capture_rejects_inconsistent_input():
    with pytest.raises(ValueError, match="response lengths"):
        choose_rows_for_capture([1, 2], [3], token_budget=10)
    with pytest.raises(ValueError, match="token_budget"):
        choose_rows_for_capture([1], [2], token_budget=0)


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
    first, third = samples_from_packed(token_values, hidden, offsets, responses, rows=[0, 2], step=4)
    assert first.token_ids.tolist() == [11, 12, 13, 21, 22] and first.step == 4
    assert first.hidden_states[:, 1].tolist() == [11, 12, 13, 21, 22]
    assert first.response_mask.tolist() == [False, False, False, True, True]
    assert third.token_ids.tolist() == [41, 42, 43, 44]
    assert third.hidden_states[:, 0].tolist() == [41, 42, 43, 44]
    assert third.response_mask.tolist() == [False, True, False, True]
    assert samples_from_packed(token_values, hidden, offsets, responses, rows=[], step=0) == []


def test_packed_samples_are_long_cpu_copies_and_a_static_pad_after_the_tokens_is_ignored():
    token_values, hidden, offsets, responses = packed_batch()
    padded_hidden = torch.cat([hidden, torch.full((3, 2), -1.0)])  # e.g. padding for sequence parallelism
    (middle,) = samples_from_packed(token_values.int(), padded_hidden, offsets, responses, rows=[1], step=0)
    assert middle.token_ids.dtype == torch.long and middle.token_ids.tolist() == [31, 32, 33]
    assert middle.hidden_states[:, 0].tolist() == [31, 32, 33]
    assert middle.response_mask.tolist() == [False, False, True]
    padded_hidden.zero_()  # the sample does not share memory with the batch
    assert middle.hidden_states[:, 0].tolist() == [31, 32, 33]


def test_packed_capture_rejects_inconsistent_input():
    token_values, hidden, offsets, responses = packed_batch()
    with pytest.raises(ValueError, match="11 hidden states for 12 tokens"):
        samples_from_packed(token_values, hidden[:-1], offsets, responses, rows=[0], step=0)
    too_long = [responses[0], torch.ones(4), responses[2]]
    with pytest.raises(ValueError, match="row 1: response mask of 4 for a sequence of 3 tokens"):
        samples_from_packed(token_values, hidden, offsets, too_long, rows=[1], step=0)
