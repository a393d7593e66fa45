"""Training data for the EAGLE drafter: captured (token ids, target hidden states) samples, a bounded buffer,
and packing into drafter training batches.

Alignment (EAGLE): the drafter at position j reads the target's hidden state h_j and the token t_{j+1} and
predicts h_{j+1} (whose LM-head distribution is the target's distribution of t_{j+2}). A sample of T tokens with
hidden states at all T positions gives T - 1 training pairs j = 0..T-2. A pair enters the loss only if position
j + 1 is a response position (the drafter drafts responses, not prompts), and padding never enters a sample at
all: `sample_from_padded_row` keeps exactly the attended positions, whether verl padded left or right.

Packing puts several samples in one row with a block-diagonal causal mask and positions restarting at each
sample, so no sample attends to another (the reference implementation packed with a plain causal mask).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import torch

from verl_tlt.drafter.teacher import TeacherLabels


@dataclass
class DrafterSample:
    """One sequence: token_ids [T] long, hidden_states [T, H] (target last layer, after the final norm),
    response_mask [T] bool (True where the token is part of the response), step: the RL step it came from,
    teacher: the target's sparse next-token distribution at each of the T positions (`verl_tlt.drafter.teacher`),
    or None until it is labelled."""

    token_ids: torch.Tensor
    hidden_states: torch.Tensor
    response_mask: torch.Tensor
    step: int = 0
    teacher: TeacherLabels | None = None

    def __post_init__(self) -> None:
        length = self.token_ids.shape[0]
        if self.hidden_states.shape[0] != length or self.response_mask.shape[0] != length:
            raise ValueError(
                f"DrafterSample needs one hidden state and one mask entry per token: {length} tokens, "
                f"{self.hidden_states.shape[0]} hidden states, {self.response_mask.shape[0]} mask entries"
            )
        if self.teacher is not None and self.teacher.num_positions != length:
            raise ValueError(
                f"DrafterSample needs teacher labels for each of its {length} tokens, got {self.teacher.num_positions}"
            )

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[0]

    def fields(self) -> tuple:
        """(token_ids, hidden_states, response_mask, step), then the teacher's (token_ids, log_probs, rest_mass) if
        labelled: how checkpoints and recordings store a sample."""
        base = (self.token_ids, self.hidden_states, self.response_mask, self.step)
        if self.teacher is None:
            return base
        return (*base, self.teacher.token_ids, self.teacher.log_probs, self.teacher.rest_mass)

    @classmethod
    def from_fields(cls, fields: object, where: str = "sample") -> DrafterSample:
        """The sample `fields()` stored; ValueError naming `where` if they are not three tensors and a step >= 0
        (then, if labelled, three teacher tensors of matching shapes)."""
        is_sample = isinstance(fields, tuple) and len(fields) in (4, 7)
        tensors = fields[:3] + fields[4:] if is_sample else ()
        if not (is_sample and all(isinstance(f, torch.Tensor) for f in tensors)):
            raise ValueError(
                f"{where} must be (token_ids, hidden_states, response_mask, step[, teacher_ids, teacher_log_probs, "
                "teacher_rest_mass])"
            )
        step = fields[3]
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"{where}/step must be an integer, found {step!r}")
        if step < 0:  # RL steps count from 0
            raise ValueError(f"{where}/step must be >= 0, found {step}")
        try:
            teacher = TeacherLabels(*fields[4:]) if len(fields) == 7 else None
            return cls(*fields[:4], teacher=teacher)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from error

    def labelled(self, teacher: TeacherLabels) -> DrafterSample:
        """This sample with `teacher` labels (the same tensors otherwise)."""
        return DrafterSample(self.token_ids, self.hidden_states, self.response_mask, self.step, teacher)

    @property
    def num_loss_pairs(self) -> int:
        return int(self.response_mask[1:].sum())

    def window(self, start: int, end: int) -> DrafterSample:
        """Tokens [start, end) with their hidden states and mask entries (views, not copies)."""
        teacher = self.teacher.window(start, end) if self.teacher is not None else None
        return DrafterSample(
            self.token_ids[start:end], self.hidden_states[start:end], self.response_mask[start:end], self.step, teacher
        )


def sample_from_padded_row(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    hidden_states: torch.Tensor,
    response_mask: torch.Tensor,
    step: int = 0,
) -> DrafterSample:
    """Cut one verl row (left-padded prompt + right-padded response, [L] / [L, H]) down to its real tokens.

    attention_mask marks real tokens; response_mask marks response tokens (both [L], any int/bool dtype). The
    hidden states stay paired with the tokens they were computed for, so padding cannot shift them.
    """
    keep = attention_mask.bool()
    if not bool(keep.any()):
        raise ValueError("sample_from_padded_row got a row with no attended tokens")
    return DrafterSample(
        token_ids=input_ids[keep].long(),
        hidden_states=hidden_states[keep],
        response_mask=response_mask.bool()[keep],
        step=step,
    )


@dataclass
class PackedBatch:
    """Training pairs of several samples packed in one row (N pairs in total).

    next_token_ids [1, N]: t_{j+1}. input_hidden [1, N, H]: h_j. target_hidden [1, N, H]: h_{j+1}.
    loss_mask [1, N] bool. positions [1, N]: j, restarting per sample. attn_mask [1, 1, N, N] bool,
    block-diagonal causal. sample_ids: the buffer ids of the packed samples. teacher: the target's sparse
    distribution of each pair's predicted token (t_{j+2}, the labels of position j + 1), None unless every packed
    sample is labelled.
    """

    next_token_ids: torch.Tensor
    input_hidden: torch.Tensor
    target_hidden: torch.Tensor
    loss_mask: torch.Tensor
    positions: torch.Tensor
    attn_mask: torch.Tensor
    sample_ids: list[int]
    teacher: TeacherLabels | None = None

    @property
    def num_pairs(self) -> int:
        return self.next_token_ids.shape[1]

    def to(self, device: torch.device | str, dtype: torch.dtype) -> PackedBatch:
        return PackedBatch(
            self.next_token_ids.to(device),
            self.input_hidden.to(device=device, dtype=dtype),
            self.target_hidden.to(device=device, dtype=dtype),
            self.loss_mask.to(device),
            self.positions.to(device),
            self.attn_mask.to(device),
            self.sample_ids,
            self.teacher.to(device) if self.teacher is not None else None,
        )


def pack(samples: list[DrafterSample], sample_ids: list[int] | None = None) -> PackedBatch:
    """Pack samples into one row of training pairs with a block-diagonal causal mask."""
    if not samples:
        raise ValueError("pack needs at least one sample")
    pieces = [_pairs(sample) for sample in samples]
    segments = torch.cat([torch.full((p[0].shape[0],), i) for i, p in enumerate(pieces)])
    positions = torch.cat([torch.arange(p[0].shape[0]) for p in pieces])
    same_sample = segments.unsqueeze(0) == segments.unsqueeze(1)
    causal = positions.unsqueeze(0) <= positions.unsqueeze(1)
    return PackedBatch(
        next_token_ids=torch.cat([p[0] for p in pieces]).unsqueeze(0),
        input_hidden=torch.cat([p[1] for p in pieces]).unsqueeze(0),
        target_hidden=torch.cat([p[2] for p in pieces]).unsqueeze(0),
        loss_mask=torch.cat([p[3] for p in pieces]).unsqueeze(0),
        positions=positions.unsqueeze(0),
        attn_mask=(same_sample & causal).view(1, 1, len(segments), len(segments)),
        sample_ids=list(sample_ids) if sample_ids is not None else list(range(len(samples))),
        teacher=_packed_teacher(samples),
    )


def _packed_teacher(samples: list[DrafterSample]) -> TeacherLabels | None:
    """The pairs' labels (positions 1..T-1 of each sample), or None unless every sample is labelled."""
    if any(sample.teacher is None for sample in samples):
        return None
    sizes = {sample.teacher.top_k for sample in samples}
    if len(sizes) > 1:
        raise ValueError(
            f"cannot pack samples labelled with different teacher top-k {sorted(sizes)}: label them with one "
            "tlt.drafter.teacher_top_k"
        )
    return TeacherLabels.cat([sample.teacher.window(1, sample.num_tokens) for sample in samples])


def _pairs(sample: DrafterSample):
    """(t_{j+1}, h_j, h_{j+1}, loss mask) for j = 0..T-2."""
    return (
        sample.token_ids[1:],
        sample.hidden_states[:-1],
        sample.hidden_states[1:],
        sample.response_mask[1:],
    )


class DrafterDataBuffer:
    """Bounded store of drafter samples: a token budget, the oldest samples evicted first.

    Batches favour what the drafter has trained on least, newest first, so fresh policy data is used as soon as
    it arrives while older samples fill the remaining budget. Samples longer than the batch budget are cut into
    windows of that size (positions restart, so a window is trained as if it were a short sequence). Samples added
    as held stay out of batches until `release_held()`: the ones a drafter worker scores the drafter on first.
    """

    def __init__(self, max_tokens: int):
        if max_tokens < 2:
            raise ValueError(f"DrafterDataBuffer.max_tokens must be >= 2, got {max_tokens}")
        self.max_tokens = max_tokens
        self.samples: OrderedDict[int, DrafterSample] = OrderedDict()  # insertion order = age
        self.times_used: dict[int, int] = {}
        self.next_id = 0
        self.num_tokens = 0
        self.num_evicted = 0
        self.num_rejected = 0  # samples refused for non-finite hidden states
        self.held: set[int] = set()  # ids kept out of batches until release_held()
        # Capture adds samples while a spot trainer may be drawing batches in another thread.
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self.samples)

    def add(self, samples: Iterable[DrafterSample], hold: Collection[int] = ()) -> int:
        """Add samples (skipping ones without any loss pair or with non-finite hidden states); evict the oldest to
        stay in budget. hold: positions in `samples` kept out of batches until `release_held()`. Returns how many
        were added."""
        with self._lock:
            return self._add(samples, frozenset(hold))

    def release_held(self) -> int:
        """Let the held samples into batches; how many there were."""
        with self._lock:
            count, self.held = len(self.held), set()
            return count

    def _add(self, samples: Iterable[DrafterSample], hold: frozenset[int] = frozenset()) -> int:
        added = 0
        for index, sample in enumerate(samples):
            if sample.num_tokens < 2 or sample.num_loss_pairs == 0:
                continue
            if not bool(torch.isfinite(sample.hidden_states).all()):
                # Packed with others, one inf/NaN hidden state would make every batch it lands in untrainable.
                self.num_rejected += 1
                continue
            self.samples[self.next_id] = sample
            self.times_used[self.next_id] = 0
            if index in hold:
                self.held.add(self.next_id)
            self.num_tokens += sample.num_tokens
            self.next_id += 1
            added += 1
        while self.num_tokens > self.max_tokens and len(self.samples) > 1:
            old_id, old = self.samples.popitem(last=False)
            del self.times_used[old_id]
            self.held.discard(old_id)
            self.num_tokens -= old.num_tokens
            self.num_evicted += 1
        return added

    def drop_oldest(self, fraction: float) -> int:
        """Evict about `fraction` of the buffered tokens, oldest samples first (memory pressure); returns how many
        samples went."""
        with self._lock:
            target = self.num_tokens * (1.0 - fraction)
            dropped = 0
            while self.samples and self.num_tokens > target:
                old_id, old = self.samples.popitem(last=False)
                del self.times_used[old_id]
                self.held.discard(old_id)
                self.num_tokens -= old.num_tokens
                self.num_evicted += 1
                dropped += 1
            return dropped

    def next_batch(self, max_tokens_per_batch: int) -> PackedBatch | None:
        """Pack the least-used (then newest) samples into at most max_tokens_per_batch tokens; None if empty."""
        with self._lock:
            return self._next_batch(max_tokens_per_batch)

    def _next_batch(self, max_tokens_per_batch: int) -> PackedBatch | None:
        order = sorted((i for i in self.samples if i not in self.held), key=lambda i: (self.times_used[i], -i))
        if not order:
            return None
        chosen, pieces, total = [], [], 0
        for sample_id in order:
            sample = _window(self.samples[sample_id], max_tokens_per_batch, self.times_used[sample_id])
            if total + sample.num_tokens > max_tokens_per_batch and chosen:
                break
            chosen.append(sample_id)
            pieces.append(sample)
            total += sample.num_tokens
        for sample_id in chosen:
            self.times_used[sample_id] += 1
        return pack(pieces, chosen)

    def state_dict(self, include_samples: bool = True) -> dict:
        """Cursor (usage counts, ids) and, optionally, the samples themselves."""
        with self._lock:
            return self._state_dict(include_samples)

    def _state_dict(self, include_samples: bool) -> dict:
        state = {"next_id": self.next_id, "times_used": dict(self.times_used), "num_evicted": self.num_evicted}
        if include_samples:
            state["samples"] = {i: s.fields() for i, s in self.samples.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            self._load_state_dict(state)

    def _load_state_dict(self, state: dict) -> None:
        if "samples" in state:
            self.samples = OrderedDict(
                (int(i), DrafterSample.from_fields(fields, f"buffer/samples/{i}"))
                for i, fields in sorted(state["samples"].items())
            )
            self.num_tokens = sum(s.num_tokens for s in self.samples.values())
        self.times_used = {int(i): n for i, n in state["times_used"].items() if int(i) in self.samples}
        for sample_id in self.samples:
            self.times_used.setdefault(sample_id, 0)
        self.next_id, self.num_evicted = state["next_id"], state["num_evicted"]


def windows(sample: DrafterSample, max_tokens: int) -> list[DrafterSample]:
    """`sample` cut into windows of at most max_tokens tokens that overlap by one token (so no pair is lost), keeping
    only windows with at least one loss pair (a long prompt can fill a whole window); [sample] if it fits."""
    if sample.num_tokens <= max_tokens:
        return [sample]
    pieces = []
    for start in range(0, sample.num_tokens - 1, max_tokens - 1):
        end = min(start + max_tokens, sample.num_tokens)
        if bool(sample.response_mask[start + 1 : end].any()):
            pieces.append(sample.window(start, end))
    return pieces


def _window(sample: DrafterSample, max_tokens: int, times_used: int) -> DrafterSample:
    """A sample that fits the batch: itself, or one window of it (successive uses walk through the windows)."""
    pieces = windows(sample, max_tokens)  # never empty: the buffer only holds samples with a loss pair
    return pieces[times_used % len(pieces)]
