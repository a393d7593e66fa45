"""Drafter data: alignment, padding, packing isolation, loss masks, the bounded buffer and its cursor."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.drafter.data import DrafterDataBuffer, DrafterSample, pack, sample_from_padded_row, windows


def marked_sample(tokens: list[int], prompt_len: int, step: int = 0) -> DrafterSample:
    """hidden_states[j] = token j in every dim, so any misalignment shows up as a wrong value."""
    ids = torch.tensor(tokens)
    hidden = ids.float().unsqueeze(-1).repeat(1, 4)
    response = torch.arange(len(tokens)) >= prompt_len
    return DrafterSample(ids, hidden, response, step)


def test_pairs_read_hidden_j_and_token_j_plus_1_and_predict_hidden_j_plus_1():
    batch = pack([marked_sample([10, 11, 12, 13, 14], prompt_len=2)])
    assert batch.next_token_ids.tolist() == [[11, 12, 13, 14]]
    assert batch.input_hidden[0, :, 0].tolist() == [10, 11, 12, 13]
    assert batch.target_hidden[0, :, 0].tolist() == [11, 12, 13, 14]
    # Pair j is in the loss iff position j + 1 is a response token (positions 2, 3, 4 here).
    assert batch.loss_mask.tolist() == [[False, True, True, True]]


def test_padded_rows_keep_each_hidden_state_with_its_token():
    # verl layout: left-padded prompt, right-padded response; the pad positions carry garbage hidden states.
    input_ids = torch.tensor([0, 0, 21, 22, 23, 31, 32, 33, 0, 0])
    attention = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 0, 0])
    response = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 0, 0])
    hidden = input_ids.float().unsqueeze(-1).repeat(1, 4)
    hidden[attention == 0] = 999.0  # zero-/garbage-filled pad features must never reach training
    sample = sample_from_padded_row(input_ids, attention, hidden, response)
    assert sample.token_ids.tolist() == [21, 22, 23, 31, 32, 33]
    assert sample.hidden_states[:, 0].tolist() == [21, 22, 23, 31, 32, 33]
    batch = pack([sample])
    assert (batch.input_hidden != 999).all() and (batch.target_hidden != 999).all()
    assert batch.loss_mask.tolist() == [[False, False, True, True, True]]


def test_packed_samples_cannot_attend_to_each_other():
    batch = pack([marked_sample([1, 2, 3, 4], 1), marked_sample([5, 6, 7], 1), marked_sample([8, 9], 1)])
    mask = batch.attn_mask[0, 0]
    segments = [0, 0, 0, 1, 1, 2]
    for i in range(6):
        for j in range(6):
            same_and_causal = segments[i] == segments[j] and j <= i
            assert bool(mask[i, j]) == same_and_causal, (i, j)
    assert batch.positions.tolist() == [[0, 1, 2, 0, 1, 0]]  # positions restart per sample


def test_sample_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="one hidden state"):
        DrafterSample(torch.tensor([1, 2, 3]), torch.zeros(2, 4), torch.ones(3, dtype=torch.bool))


def test_buffer_evicts_oldest_samples_beyond_its_token_budget():
    buffer = DrafterDataBuffer(max_tokens=12)
    buffer.add([marked_sample([1, 2, 3, 4, 5], 1, step=0), marked_sample([6, 7, 8, 9, 10], 1, step=1)])
    buffer.add([marked_sample([11, 12, 13, 14, 15], 1, step=2)])
    assert buffer.num_tokens == 10 and buffer.num_evicted == 1
    assert [s.step for s in buffer.samples.values()] == [1, 2]


def test_new_data_is_trained_on_first_and_the_cursor_advances():
    # The reference implementation's data gate never advanced; here each add is served by the next batch.
    buffer = DrafterDataBuffer(max_tokens=1000)
    buffer.add([marked_sample([1, 2, 3, 4], 1, step=0)])
    first = buffer.next_batch(max_tokens_per_batch=4)
    buffer.add([marked_sample([5, 6, 7, 8], 1, step=1)])
    second = buffer.next_batch(max_tokens_per_batch=4)
    assert first.sample_ids == [0] and second.sample_ids == [1]
    third = buffer.next_batch(max_tokens_per_batch=8)  # both used once: newest first, then the older one
    assert third.sample_ids == [1, 0]
    assert buffer.times_used == {0: 2, 1: 2}


def test_samples_without_response_pairs_are_not_stored():
    buffer = DrafterDataBuffer(max_tokens=100)
    assert buffer.add([marked_sample([1, 2, 3], prompt_len=3), marked_sample([4], prompt_len=0)]) == 0
    assert len(buffer) == 0 and buffer.next_batch(16) is None


def test_long_samples_are_served_window_by_window():
    buffer = DrafterDataBuffer(max_tokens=100)
    buffer.add([marked_sample(list(range(10, 20)), prompt_len=0)])
    windows = [buffer.next_batch(max_tokens_per_batch=4) for _ in range(3)]
    covered = [w.next_token_ids[0].tolist() for w in windows]
    assert covered == [[11, 12, 13], [14, 15, 16], [17, 18, 19]]  # every pair exactly once across the windows


def test_buffer_state_round_trip_keeps_samples_and_cursor():
    buffer = DrafterDataBuffer(max_tokens=100)
    buffer.add([marked_sample([1, 2, 3, 4], 1), marked_sample([5, 6, 7], 1)])
    buffer.next_batch(4)
    restored = DrafterDataBuffer(max_tokens=100)
    restored.load_state_dict(buffer.state_dict())
    assert restored.times_used == buffer.times_used and restored.next_id == buffer.next_id
    assert restored.next_batch(4).sample_ids == buffer.next_batch(4).sample_ids


def test_samples_with_non_finite_hidden_states_are_refused():
    good = DrafterSample(torch.arange(4), torch.zeros(4, 2), torch.tensor([False, True, True, True]))
    response = torch.tensor([False, True, True, True])
    bad = DrafterSample(torch.arange(4), torch.tensor([[0.0, float("nan")]] * 4), response)
    buffer = DrafterDataBuffer(max_tokens=100)
    assert buffer.add([bad, good]) == 1 and buffer.num_rejected == 1 and len(buffer) == 1


def test_windows_without_a_loss_pair_are_never_served():
    """A prompt longer than a window fills whole windows with prompt positions: those would train on nothing."""
    length, prompt = 30, 20
    sample = DrafterSample(torch.arange(length), torch.randn(length, 2), torch.arange(length) >= prompt)
    pieces = windows(sample, 8)
    assert pieces and all(piece.num_loss_pairs > 0 for piece in pieces)
    assert sum(piece.num_loss_pairs for piece in pieces) == sample.num_loss_pairs  # no pair lost
    buffer = DrafterDataBuffer(max_tokens=100)
    buffer.add([sample])
    for _ in range(6):
        assert bool(buffer.next_batch(8).loss_mask.any())


def test_drop_oldest_evicts_the_oldest_samples_until_the_share_is_gone():
    buffer = DrafterDataBuffer(max_tokens=1000)
    for length in (10, 20, 30, 40):  # 100 tokens, oldest first
        buffer.add([marked_sample(list(range(3, 3 + length)), prompt_len=2)])
    assert buffer.drop_oldest(0.25) == 2 and buffer.num_tokens == 70  # to at most 75 tokens: the 10 and the 20 go
    assert buffer.drop_oldest(1.0) == 2 and buffer.num_tokens == 0 and len(buffer) == 0
    assert buffer.drop_oldest(0.5) == 0


def test_held_samples_stay_out_of_batches_until_released():
    buffer = DrafterDataBuffer(max_tokens=1000)
    buffer.add([marked_sample([1, 2, 3, 4], 1, step=0), marked_sample([5, 6, 7, 8], 1, step=0)], hold=[1])
    assert buffer.held == {1}
    for _ in range(3):  # however often the trainer draws, the held sample is not in a batch
        assert buffer.next_batch(max_tokens_per_batch=8).sample_ids == [0]
    assert buffer.release_held() == 1 and not buffer.held
    assert buffer.next_batch(max_tokens_per_batch=4).sample_ids == [1]  # least used: its turn now


def test_a_buffer_holding_only_held_samples_has_no_batch():
    buffer = DrafterDataBuffer(max_tokens=1000)
    buffer.add([marked_sample([1, 2, 3, 4], 1)], hold=[0])
    assert buffer.next_batch(max_tokens_per_batch=8) is None
