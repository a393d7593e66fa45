"""Which parts of the finished responses feed the drafter, and how a captured batch becomes drafter samples.

During RL the actor's forward over the finished rollout batch already computes the target's last-layer hidden
states; TLT keeps a token-budgeted sample of them: windows of responses, drawn with a weight that favours the
positions the rollout decodes with speculation on. Every rollout request starts together, so position p of a
response is decoded while the responses longer than p still run; once at most `sd_batch` of them do (the
speculation threshold times the replicas), the engines speculate. Those late positions of the longest responses are
what the drafter serves in the long tail, and what a longest-first prefix of a small per-rank budget never reaches.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verl_tlt.drafter.data import DrafterSample, sample_from_padded_row


@dataclass(frozen=True)
class CaptureWindows:
    """How a step's capture budget is spent (``tlt.drafter.capture_*``; sd_batch from ``tlt.speculative``).

    window_tokens: response tokens per window; tail_weight: a position decoded with speculation on weighs this many
    times one decoded plainly; sd_batch: running responses at or below which the rollout speculates, for the rows
    this rank sees (the threshold times the replicas, over the data-parallel ranks)."""

    window_tokens: int = 512
    tail_weight: float = 8.0
    sd_batch: int = 32


def speculation_start(response_lengths: Sequence[int], sd_batch: int) -> int:
    """The first response position decoded while at most `sd_batch` responses still run (0: all of them)."""
    ordered = sorted(response_lengths, reverse=True)
    return ordered[sd_batch] if len(ordered) > sd_batch else 0


def choose_windows_for_capture(
    response_lengths: Sequence[int],
    total_lengths: Sequence[int],
    token_budget: int,
    windows: CaptureWindows = CaptureWindows(),
    seed: int = 0,
) -> list[tuple[int, int, int]]:
    """(row, start, end) token ranges of the batch's sequences to capture, within `token_budget` tokens.

    Each response is cut into windows of `window_tokens` response tokens (the first with the prompt before it, later
    ones with the token before them, whose hidden state predicts the window's first token). A window weighs the sum
    over its positions of `tail_weight` (decoded with speculation on: at or after ``speculation_start``) or 1
    (before); windows are drawn without replacement with probability proportional to weight (Efraimidis-Spirakis
    keys, seeded: every sequence-parallel rank and every rerun of a step draws alike), taking each that still fits
    the budget, and a row's adjacent windows merge. Returns ranges in ascending (row, start) order.
    """
    if len(response_lengths) != len(total_lengths):
        raise ValueError(
            f"choose_windows_for_capture: {len(response_lengths)} response lengths vs {len(total_lengths)} totals"
        )
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    tail_from = speculation_start(response_lengths, windows.sd_batch)
    candidates = []  # (key, row, start, end)
    rng = random.Random(seed)
    for row, (response, total) in enumerate(zip(response_lengths, total_lengths, strict=True)):
        prompt = total - response
        for first in range(0, response, windows.window_tokens):
            last = min(first + windows.window_tokens, response)  # response positions [first, last)
            tail = max(0, last - max(first, tail_from))
            weight = tail * windows.tail_weight + (last - first - tail)
            key = rng.random() ** (1.0 / weight)
            # A response's first window carries its prompt, the context the drafter's attention reads there; a later
            # one the token before it, whose hidden state predicts the window's first token.
            start = 0 if first == 0 else prompt + first - 1
            candidates.append((key, row, start, prompt + last))
    chosen, used = [], 0
    for _, row, start, end in sorted(candidates, key=lambda c: -c[0]):
        if used + end - start <= token_budget:
            chosen.append((row, start, end))
            used += end - start
    merged: list[tuple[int, int, int]] = []
    for row, start, end in sorted(chosen):
        if merged and merged[-1][0] == row and start <= merged[-1][2]:
            merged[-1] = (row, merged[-1][1], max(end, merged[-1][2]))
        else:
            merged.append((row, start, end))
    return merged


def samples_from_batch(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    hidden_states: torch.Tensor,
    rows: Sequence[int],
    step: int,
) -> list[DrafterSample]:
    """Drafter samples for `rows` of a verl batch ([B, L] ids/masks, [B, L, H] hidden states), moved to CPU."""
    samples = []
    for row in rows:
        sample = sample_from_padded_row(
            input_ids[row], attention_mask[row], hidden_states[row], response_mask[row], step=step
        )
        samples.append(
            DrafterSample(
                sample.token_ids.cpu(),
                sample.hidden_states.detach().to("cpu", copy=True),
                sample.response_mask.cpu(),
                step,
            )
        )
    return samples


def samples_from_packed(
    token_values: torch.Tensor,
    hidden_values: torch.Tensor,
    seq_offsets: Sequence[int],
    response_masks: Sequence[torch.Tensor],
    windows: Sequence[tuple[int, int, int]],
    step: int,
) -> list[DrafterSample]:
    """Drafter samples of `windows` (row, start, end) of a packed batch (verl's jagged layout, no padding): tokens
    [start, end) of sequence `row` each, copied to CPU (the window alone, never its whole row).

    token_values [N] and hidden_values [N, H] hold the sequences back to back, sequence i at
    [seq_offsets[i], seq_offsets[i + 1]); response_masks[i] covers the last len(response_masks[i]) tokens of
    sequence i (verl's nested response_mask: 1 for generated tokens, 0 for e.g. tool output in multi-turn).
    """
    if hidden_values.shape[0] < token_values.shape[0]:
        raise ValueError(f"{hidden_values.shape[0]} hidden states for {token_values.shape[0]} tokens")
    samples = []
    for row, first, last in windows:
        start, end = int(seq_offsets[row]), int(seq_offsets[row + 1])
        if not 0 <= first < last <= end - start:
            raise ValueError(f"row {row}: window [{first}, {last}) outside its {end - start} tokens")
        response = response_masks[row].bool().cpu()
        if response.shape[0] > end - start:
            raise ValueError(f"row {row}: response mask of {response.shape[0]} for a sequence of {end - start} tokens")
        mask = torch.zeros(end - start, dtype=torch.bool)
        mask[end - start - response.shape[0] :] = response
        samples.append(
            DrafterSample(
                token_values[start + first : start + last].detach().to("cpu", torch.long, copy=True),
                hidden_values[start + first : start + last].detach().to("cpu", copy=True),
                mask[first:last].clone(),
                step,
            )
        )
    return samples
