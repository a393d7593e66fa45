"""The draft vocabulary: the target tokens the drafter drafts over (EAGLE-3's reduced vocabulary, its `d2t` map).

A reasoning policy spends almost all of its probability on a few thousand of its 49k-152k tokens, and a draft
outside them is almost never accepted, so the drafter's LM head needs only those rows: drafting and training cost
per token falls with the draft vocabulary's size instead of the target's. Verification stays over the full
vocabulary: the draft distribution is a proper distribution over the full vocabulary that is zero outside the draft
vocabulary (`EagleDrafterModel.logits`), so speculative decoding stays lossless, and only acceptance can suffer
when the policy samples a token the map lacks (`miss_share`, a `tlt/drafter/*` metric).

Slot s of the draft head is target token `ids[s]`. The map is chosen by frequency among the response tokens of
the data the drafter trains on (the most frequent first, ties by lower id), and grows only by appending: tokens
already in it keep their slots, so whatever was learned per slot (EAGLE-3's own head) stays where it was.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class DraftVocab:
    """ids [Vd] long: the target token id of each draft slot (distinct, in [0, vocab_size)); capacity: the most slots
    the map may grow to (`tlt.drafter.draft_vocab_size`)."""

    def __init__(self, ids: torch.Tensor, vocab_size: int, capacity: int):
        ids = torch.as_tensor(ids, dtype=torch.long, device="cpu").flatten()
        if ids.numel() == 0:
            raise ValueError("a draft vocabulary needs at least one token")
        if capacity < ids.numel():
            raise ValueError(f"a draft vocabulary of {ids.numel()} tokens does not fit its capacity {capacity}")
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ValueError(
                f"draft vocabulary ids must be in [0, {vocab_size}), found {int(ids.min())}..{int(ids.max())}"
            )
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError("draft vocabulary ids must be distinct")
        self.ids, self.vocab_size, self.capacity = ids, vocab_size, capacity
        # [V]: the slot of each token, -1 = none; on the host whatever the default device.
        self.target_to_draft = torch.full((vocab_size,), -1, dtype=torch.long, device="cpu")
        self.target_to_draft[ids] = torch.arange(ids.numel(), device="cpu")

    def __len__(self) -> int:
        return self.ids.numel()

    @classmethod
    def from_counts(cls, counts: torch.Tensor, capacity: int) -> DraftVocab:
        """The `capacity` most frequent tokens of `counts` ([V] token counts); only tokens that occur."""
        if capacity < 1:
            raise ValueError(f"a draft vocabulary needs a capacity >= 1, got {capacity}")
        ids = _most_frequent(counts, torch.zeros_like(counts, dtype=torch.bool), capacity)
        if ids.numel() == 0:
            raise ValueError("cannot choose a draft vocabulary from data without any response token")
        return cls(ids, counts.numel(), capacity)

    def grown(self, counts: torch.Tensor) -> DraftVocab:
        """This map with the most frequent tokens of `counts` that it lacks appended, up to its capacity (itself if
        none is missing or it is full)."""
        room = self.capacity - len(self)
        if room <= 0:
            return self
        present = self.target_to_draft >= 0
        extra = _most_frequent(counts, present, room)
        if extra.numel() == 0:
            return self
        return DraftVocab(torch.cat([self.ids, extra]), self.vocab_size, self.capacity)

    def miss_share(self, token_ids: torch.Tensor) -> float:
        """The share of `token_ids` (target ids, any shape) outside the map; 0 for no tokens."""
        if token_ids.numel() == 0:
            return 0.0
        return float((self.target_to_draft[token_ids.flatten().cpu()] < 0).float().mean())


def response_token_counts(samples: Iterable, vocab_size: int) -> torch.Tensor:
    """[V] counts of the response tokens of `samples` (`DrafterSample`s): the tokens the drafter must draft."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for sample in samples:
        counts += torch.bincount(sample.token_ids[sample.response_mask].long(), minlength=vocab_size)[:vocab_size]
    return counts


def _most_frequent(counts: torch.Tensor, exclude: torch.Tensor, limit: int) -> torch.Tensor:
    """Up to `limit` ids with a count > 0 outside `exclude`, most frequent first, ties by lower id."""
    counts = counts.long().cpu().masked_fill(exclude.cpu(), 0)
    ids = torch.nonzero(counts > 0).flatten()
    # Stable sort by descending count: equal counts keep ascending id order.
    order = torch.sort(-counts[ids], stable=True).indices
    return ids[order][:limit]
