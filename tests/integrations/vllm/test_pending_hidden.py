"""The store of what the drafter has not seen (pure torch: no vLLM needed)."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.integrations.vllm.pending_hidden import PendingHidden

HIDDEN = 3


def hidden_at(positions: list[int], salt: float = 0.0) -> torch.Tensor:
    """A recognisable hidden state per position (row = position + salt in every column)."""
    return torch.tensor(positions, dtype=torch.float32)[:, None].repeat(1, HIDDEN) + salt


def step(batch: dict[str, list[int]]):
    """A step's flattened inputs: request -> its query positions; token at position p is 1000 * request + p."""
    query_start_loc, positions, tokens = [0], [], []
    for index, (_, query) in enumerate(batch.items()):
        positions += query
        tokens += [1000 * index + p for p in query]
        query_start_loc.append(len(positions))
    return list(batch), query_start_loc, torch.tensor(tokens), torch.tensor(positions)


def defer(store: PendingHidden, batch: dict[str, list[int]], salt: float = 0.0) -> None:
    ids, qsl, tokens, positions = step(batch)
    store.defer(ids, qsl, tokens, positions, hidden_at(positions.tolist(), salt))


def test_take_returns_every_position_since_the_first_deferred_one_in_order():
    store = PendingHidden(window=16, capacity_tokens=100)
    defer(store, {"a": [5], "b": [9]})
    defer(store, {"a": [6], "b": [10]})
    ids, qsl, tokens, positions = step({"a": [7], "b": [11]})
    segments, broken = store.take(ids, qsl, tokens, positions)
    assert broken == [] and len(store) == 0
    assert segments.rows == [0, 1] and segments.starts == [5, 9] and segments.ends == [7, 11]
    assert segments.positions.tolist() == [5, 6, 9, 10]
    assert segments.token_ids.tolist() == [5, 6, 1009, 1010]
    assert segments.hidden_states[:, 0].tolist() == [5.0, 6.0, 9.0, 10.0]
    # The drafter's input at each range's last position is the token at the position the step starts with.
    assert segments.next_token_ids.tolist() == [7, 1011]


def test_positions_processed_again_after_rejected_drafts_keep_their_last_values():
    store = PendingHidden(window=16, capacity_tokens=100)
    defer(store, {"a": [10, 11, 12, 13, 14]}, salt=0.5)  # a step that verified 4 drafts and accepted 1
    defer(store, {"a": [12]}, salt=0.25)  # position 12 again, with the committed token's hidden state
    ids, qsl, tokens, positions = step({"a": [13]})
    segments, _ = store.take(ids, qsl, tokens, positions)
    assert segments.positions.tolist() == [10, 11, 12]
    assert segments.hidden_states[:, 0].tolist() == [10.5, 11.5, 12.25]


def test_fits_bounds_each_window_and_the_total():
    store = PendingHidden(window=4, capacity_tokens=7)
    defer(store, {"a": [0, 1, 2], "b": [0, 1]})
    assert store.fits(["a", "b"], [1, 1])
    assert not store.fits(["a", "b"], [2, 1])  # a's window: 3 + 2 > 4
    assert not store.fits(["a", "b", "c"], [1, 1, 1])  # the total: 5 + 3 > 7
    assert store.fits(["c"], [1])


def test_rows_without_pending_positions_are_not_taken_and_others_stay():
    store = PendingHidden(window=8, capacity_tokens=100)
    defer(store, {"a": [3], "b": [4]})
    ids, qsl, tokens, positions = step({"c": [1], "b": [5]})
    segments, _ = store.take(ids, qsl, tokens, positions)
    assert segments.rows == [1] and segments.starts == [4] and segments.ends == [5]
    assert "a" in store and "b" not in store


def test_a_request_that_moved_below_its_range_is_dropped_and_named():
    store = PendingHidden(window=8, capacity_tokens=100)
    defer(store, {"a": [30, 31]})
    ids, qsl, tokens, positions = step({"a": [0, 1, 2]})  # recomputed from its start after a preemption
    segments, broken = store.take(ids, qsl, tokens, positions)
    assert segments is None and broken == ["a"] and len(store) == 0


def test_rings_grow_past_their_first_size_and_slots_are_reused():
    store = PendingHidden(window=2, capacity_tokens=1000)
    batch = {f"r{i}": [i] for i in range(20)}
    defer(store, batch)
    ids, qsl, tokens, positions = step({name: [p[0] + 1] for name, p in batch.items()})
    segments, _ = store.take(ids, qsl, tokens, positions)
    assert segments.positions.tolist() == list(range(20))
    assert segments.hidden_states[:, 0].tolist() == [float(i) for i in range(20)]
    size = store.ring_bytes()
    defer(store, batch)
    assert store.ring_bytes() == size  # the freed slots, not new ones


def test_forget_and_keep_only_drop_requests():
    store = PendingHidden(window=8, capacity_tokens=100)
    defer(store, {"a": [1], "b": [1], "c": [1]})
    store.forget(["a"])
    store.keep_only({"c": object()})
    assert "a" not in store and "b" not in store and "c" in store


@pytest.mark.parametrize(("window", "capacity"), [(0, 10), (4, 0)])
def test_bad_sizes_are_refused(window, capacity):
    with pytest.raises(ValueError, match="window|capacity"):
        PendingHidden(window, capacity)
