"""Which finished responses feed the drafter, and how a captured batch becomes drafter samples.

During RL the actor's forward over the finished rollout batch already computes the target's last-layer hidden
states; TLT keeps a token-budgeted sample of them. Long responses are preferred: they are where the rollout's
long tail spends its time, so they are what speculative decoding must be good at (and they carry the most
training pairs per sample).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verl_tlt.drafter.data import DrafterSample, sample_from_padded_row

# A response too long for what is left of the budget is captured as a prefix if that holds at least this many
# response tokens (fewer are not worth the budget they would use).
PREFIX_MIN_RESPONSE_TOKENS = 64


def choose_rows_for_capture(
    response_lengths: Sequence[int], total_lengths: Sequence[int], token_budget: int
) -> list[tuple[int, int]]:
    """Rows to capture and how many of their tokens: longest responses first, within the token budget.

    A row that fits what is left of the budget is taken whole. One that does not is taken as a prefix (its prompt
    and the start of its response, up to the budget) if that prefix holds at least PREFIX_MIN_RESPONSE_TOKENS
    response tokens, else skipped: with a small per-rank budget, skipping every response longer than the budget
    would feed the drafter only short answers, and the long tail is what it must be good at. Training windows long
    samples anyway, restarting positions, so a prefix loses no context a window would have had. Ties keep the
    batch order, so the choice is deterministic. Returns (row, tokens to keep) in ascending row order.
    """
    if len(response_lengths) != len(total_lengths):
        raise ValueError(
            f"choose_rows_for_capture: {len(response_lengths)} response lengths vs {len(total_lengths)} totals"
        )
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    order = sorted(range(len(response_lengths)), key=lambda row: (-response_lengths[row], row))
    chosen, used = [], 0
    for row in order:
        room, total = token_budget - used, total_lengths[row]
        if response_lengths[row] < 1:
            continue
        if total <= room:
            take = total
        elif room - (total - response_lengths[row]) >= PREFIX_MIN_RESPONSE_TOKENS:
            take = room
        else:
            continue
        chosen.append((row, take))
        used += take
    return sorted(chosen)


def truncated(sample: DrafterSample, num_tokens: int) -> DrafterSample:
    """The first num_tokens tokens of `sample` (itself if it is not longer)."""
    return sample if sample.num_tokens <= num_tokens else sample.window(0, num_tokens)


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
    rows: Sequence[int],
    step: int,
) -> list[DrafterSample]:
    """Drafter samples for `rows` of a packed batch (verl's jagged layout, no padding).

    token_values [N] and hidden_values [N, H] hold the sequences back to back, sequence i at
    [seq_offsets[i], seq_offsets[i + 1]); response_masks[i] covers the last len(response_masks[i]) tokens of
    sequence i (verl's nested response_mask: 1 for generated tokens, 0 for e.g. tool output in multi-turn).
    """
    if hidden_values.shape[0] < token_values.shape[0]:
        raise ValueError(f"{hidden_values.shape[0]} hidden states for {token_values.shape[0]} tokens")
    samples = []
    for row in rows:
        start, end = int(seq_offsets[row]), int(seq_offsets[row + 1])
        response = response_masks[row].bool().cpu()
        if response.shape[0] > end - start:
            raise ValueError(f"row {row}: response mask of {response.shape[0]} for a sequence of {end - start} tokens")
        mask = torch.zeros(end - start, dtype=torch.bool)
        mask[end - start - response.shape[0] :] = response
        samples.append(
            DrafterSample(
                token_values[start:end].detach().to("cpu", torch.long, copy=True),
                hidden_values[start:end].detach().to("cpu", copy=True),
                mask,
                step,
            )
        )
    return samples
