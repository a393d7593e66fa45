"""Capture: long responses first within a token budget; padded verl rows become aligned samples."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.drafter.capture import choose_rows_for_capture, samples_from_batch


def test_longest_responses_are_captured_first_within_the_budget():
    responses = [10, 300, 50, 300, 0, 900]
    totals = [20, 310, 60, 310, 10, 910]
    assert choose_rows_for_capture(responses, totals, token_budget=700) == [0, 1, 2, 3]  # 910 alone does not fit
    assert choose_rows_for_capture(responses, totals, token_budget=2000) == [0, 1, 2, 3, 5]  # empty row skipped
    assert choose_rows_for_capture(responses, totals, token_budget=5) == []


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
