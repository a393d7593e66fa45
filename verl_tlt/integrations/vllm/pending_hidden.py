"""What the drafter has not seen yet, per request: the target's hidden states of tokens decoded plainly (pure torch).

An EAGLE drafter keeps a KV cache of its own, written by its *first pass*: at position q it reads the target's
hidden state h_q and the next token t_{q+1}. vLLM runs that pass every step, even when the step drafts nothing
(K=0), so that the drafter's cache is complete when speculation resumes; on a long plain stretch that pass is the
whole cost of speculative decoding being switched on. Here the pass is deferred instead: each plain step stores the
step's input tokens and hidden states by position in a per-request ring of ``window`` positions, and the pass runs
later over everything stored at once (one forward for many steps: ``take``), either when the request's next
speculative step comes or when the ring would overflow.

Positions, not steps, index the ring: a step that verified drafts processes positions past the ones it accepts, and
those positions are processed again by the next step, which overwrites them. So for a request whose next step starts
at position s, the ring holds exactly positions [pending_from, s), whatever was rejected in between.

No vLLM here: the caller (``deferred_first_pass``) maps a step's batch onto these calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class _Entry:
    slot: int  # the request's row in the ring
    pending_from: torch.Tensor  # 0-d: the first position the drafter has not seen (on the device; read lazily)
    stored_bound: int  # query tokens stored since pending_from: an upper bound on the ring's span (CPU, no sync)


@dataclass
class Segments:
    """Stored positions to run the drafter's first pass on, one contiguous range per request."""

    rows: list[int]  # each request's row in the step's batch
    starts: list[int]  # first position of each range
    ends: list[int]  # one past the last (the position the request's current query starts at)
    token_ids: torch.Tensor  # [sum of lengths] the token at each position (the target's input there)
    positions: torch.Tensor  # [sum of lengths]
    hidden_states: torch.Tensor  # [sum of lengths, hidden] the target's hidden state at each position
    next_token_ids: torch.Tensor  # [len(rows)] the token at each range's end: the drafter's input at end - 1

    @property
    def num_tokens(self) -> int:
        return int(self.positions.numel())


class PendingHidden:
    """Per-request rings of target hidden states the drafter's first pass has not consumed.

    `window`: positions a request may have pending before they must be consumed. `capacity_tokens`: the most
    pending tokens over all requests (what one first pass can take: vLLM's drafter buffers hold
    ``max_num_batched_tokens``). Rings are allocated on first use, for as many requests as are pending, and grow.
    """

    def __init__(self, window: int, capacity_tokens: int):
        if window < 1:
            raise ValueError(f"window must be >= 1 positions, got {window}")
        if capacity_tokens < 1:
            raise ValueError(f"capacity_tokens must be >= 1, got {capacity_tokens}")
        self.window, self.capacity_tokens = window, capacity_tokens
        self._entries: dict[str, _Entry] = {}
        self._free: list[int] = []
        self._hidden: torch.Tensor | None = None  # [slots, window, hidden]
        self._tokens: torch.Tensor | None = None  # [slots, window]

    # ----- what is pending ---------------------------------------------------------------------------------------

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def pending_bound(self) -> int:
        """An upper bound on the tokens pending over all requests (exact unless a step had rejected drafts)."""
        return sum(entry.stored_bound for entry in self._entries.values())

    def pending_rows(self, request_ids: list[str]) -> list[int]:
        """The rows of `request_ids` (a step's batch, in order) that have pending positions."""
        return [row for row, request_id in enumerate(request_ids) if request_id in self._entries]

    def fits(self, request_ids: list[str], lengths: list[int]) -> bool:
        """Whether a step whose rows query `lengths` tokens can be stored without any ring overflowing and
        without the pending total passing `capacity_tokens`."""
        total = self.pending_bound
        for request_id, length in zip(request_ids, lengths, strict=True):
            entry = self._entries.get(request_id)
            if (entry.stored_bound if entry else 0) + length > self.window:
                return False
            total += length
        return total <= self.capacity_tokens

    # ----- store, take, forget -----------------------------------------------------------------------------------

    def defer(
        self,
        request_ids: list[str],
        query_start_loc: list[int],
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
    ) -> None:
        """Store a step's query tokens: row i's are [query_start_loc[i], query_start_loc[i + 1]) of the tensors.

        The caller checked ``fits``. No device-to-host copy: only CPU-side lengths are read."""
        lengths = [query_start_loc[i + 1] - query_start_loc[i] for i in range(len(request_ids))]
        new_rows = [row for row, request_id in enumerate(request_ids) if request_id not in self._entries]
        if new_rows:
            starts = positions[torch.tensor([query_start_loc[row] for row in new_rows], device=positions.device)]
            starts = starts.clone()
            for index, row in enumerate(new_rows):
                self._entries[request_ids[row]] = _Entry(self._take_slot(hidden_states), starts[index], 0)
        slots = torch.tensor([self._entries[request_id].slot for request_id in request_ids])
        num_tokens = query_start_loc[len(request_ids)]
        slot_of_token = torch.repeat_interleave(slots, torch.tensor(lengths)).to(positions.device)
        flat = slot_of_token * self.window + positions[:num_tokens] % self.window
        assert self._hidden is not None and self._tokens is not None
        self._hidden.view(-1, self._hidden.shape[-1]).index_copy_(0, flat, hidden_states[:num_tokens])
        self._tokens.view(-1).index_copy_(0, flat, token_ids[:num_tokens].to(self._tokens.dtype))
        for request_id, length in zip(request_ids, lengths, strict=True):
            self._entries[request_id].stored_bound += length

    def take(
        self,
        request_ids: list[str],
        query_start_loc: list[int],
        token_ids: torch.Tensor,
        positions: torch.Tensor,
    ) -> tuple[Segments | None, list[str]]:
        """Remove and return what the rows of this step's batch have pending, ranges ending where each row's query
        starts; and the requests whose stored range was not usable (dropped: the caller reports them).

        One device-to-host copy (the ranges' bounds)."""
        rows = self.pending_rows(request_ids)
        if not rows:
            return None, []
        entries = [self._entries.pop(request_ids[row]) for row in rows]
        first = torch.tensor([query_start_loc[row] for row in rows], device=positions.device)
        bounds = torch.stack([torch.stack([entry.pending_from for entry in entries]), positions[first]]).tolist()
        kept_rows, starts, ends, gather, broken = [], [], [], [], []
        for row, entry, start, end in zip(rows, entries, bounds[0], bounds[1], strict=True):
            self._free.append(entry.slot)
            if not 0 < end - start <= self.window:
                # The request restarted below its stored range (recomputed after a preemption) or skipped part
                # of it: what is stored is not the context the drafter needs.
                broken.append(request_ids[row])
                continue
            kept_rows.append(row)
            starts.append(start)
            ends.append(end)
            gather.append(entry.slot * self.window + torch.arange(start, end) % self.window)
        if not kept_rows:
            return None, broken
        assert self._hidden is not None and self._tokens is not None
        device = self._hidden.device
        flat = torch.cat(gather).to(device)
        segments = Segments(
            rows=kept_rows,
            starts=starts,
            ends=ends,
            token_ids=self._tokens.view(-1)[flat].to(token_ids.dtype),
            positions=torch.cat([torch.arange(a, b) for a, b in zip(starts, ends, strict=True)]).to(
                device=positions.device, dtype=positions.dtype
            ),
            hidden_states=self._hidden.view(-1, self._hidden.shape[-1])[flat],
            next_token_ids=token_ids[torch.tensor([query_start_loc[row] for row in kept_rows], device=device)],
        )
        return segments, broken

    def forget(self, request_ids) -> None:
        """Drop what `request_ids` have pending (finished, preempted or aborted requests)."""
        for request_id in list(request_ids):
            entry = self._entries.pop(request_id, None)
            if entry is not None:
                self._free.append(entry.slot)

    def keep_only(self, live_request_ids) -> None:
        """Drop every request not in `live_request_ids` (a set or dict of the engine's requests)."""
        gone = [request_id for request_id in self._entries if request_id not in live_request_ids]
        if gone:
            self.forget(gone)

    # ----- the rings ---------------------------------------------------------------------------------------------

    def _take_slot(self, like: torch.Tensor) -> int:
        if self._free:
            return self._free.pop()
        used = 0 if self._hidden is None else self._hidden.shape[0]
        grown = max(8, 2 * used)
        hidden = torch.empty(grown, self.window, like.shape[-1], dtype=like.dtype, device=like.device)
        tokens = torch.zeros(grown, self.window, dtype=torch.int64, device=like.device)
        if self._hidden is not None and self._tokens is not None:
            hidden[:used] = self._hidden
            tokens[:used] = self._tokens
        self._hidden, self._tokens = hidden, tokens
        self._free.extend(range(grown - 1, used, -1))  # popped lowest first
        return used

    def ring_bytes(self) -> int:
        """Memory the rings hold now."""
        if self._hidden is None or self._tokens is None:
            return 0
        return self._hidden.nbytes + self._tokens.nbytes
