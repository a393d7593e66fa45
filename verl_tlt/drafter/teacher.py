"""The target's next-token distribution as sparse training labels, computed once per captured token.

The drafter's token loss compares its next-token distribution with the target's. Recomputing the target's
distribution at every optimizer step runs the target's LM head over [tokens, vocab] logits again and again (at a
152k vocabulary that is most of a step's work); the target's distribution of a captured token never changes, so it
is computed once, where the hidden state is captured, and kept sparse: the top-k token ids, their log-probs and
the probability mass of every other token (`rest_mass`). With k equal to the vocabulary nothing is lost (the loss
then equals the dense one); at small k the loss scores the drafter on a (k + 1)-way partition of the vocabulary:
the k likeliest tokens and "the rest" (see `verl_tlt.drafter.losses`).

Position i's labels are the distribution of token i + 1 given tokens 0..i (the target's LM head on its hidden
state at i), so a training pair whose target feature is h_{j+1} is scored against labels[j + 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Positions per LM-head call when labelling: bounds the [chunk, vocab] fp32 logits (0.2 GB at a 49k vocabulary).
LABEL_CHUNK_TOKENS = 1024


@dataclass
class TeacherLabels:
    """token_ids [T, k] long (the target's k likeliest next tokens, likeliest first), log_probs [T, k] float32 (their
    log-probabilities), rest_mass [T] float32 (the probability of every other token, in [0, 1])."""

    token_ids: torch.Tensor
    log_probs: torch.Tensor
    rest_mass: torch.Tensor

    def __post_init__(self) -> None:
        if self.token_ids.dim() != 2 or self.log_probs.shape != self.token_ids.shape:
            raise ValueError(
                f"TeacherLabels needs token_ids and log_probs of one shape [T, k], got {tuple(self.token_ids.shape)} "
                f"and {tuple(self.log_probs.shape)}"
            )
        if self.rest_mass.shape != self.token_ids.shape[:1]:
            raise ValueError(
                f"TeacherLabels needs one rest_mass per position: {self.token_ids.shape[0]} positions, rest_mass "
                f"{tuple(self.rest_mass.shape)}"
            )

    @property
    def num_positions(self) -> int:
        return self.token_ids.shape[0]

    @property
    def top_k(self) -> int:
        return self.token_ids.shape[1]

    def window(self, start: int, end: int) -> TeacherLabels:
        return TeacherLabels(self.token_ids[start:end], self.log_probs[start:end], self.rest_mass[start:end])

    def select(self, index: torch.Tensor) -> TeacherLabels:
        """The labels of positions `index` ([N] long), in that order."""
        return TeacherLabels(self.token_ids[index], self.log_probs[index], self.rest_mass[index])

    def to(self, device: torch.device | str) -> TeacherLabels:
        return TeacherLabels(self.token_ids.to(device), self.log_probs.to(device), self.rest_mass.to(device))

    @staticmethod
    def cat(parts: list[TeacherLabels]) -> TeacherLabels:
        return TeacherLabels(
            torch.cat([p.token_ids for p in parts]),
            torch.cat([p.log_probs for p in parts]),
            torch.cat([p.rest_mass for p in parts]),
        )


@torch.no_grad()
def teacher_labels(
    hidden_states: torch.Tensor, head_weight: torch.Tensor, top_k: int, *, chunk_tokens: int = LABEL_CHUNK_TOKENS
) -> TeacherLabels:
    """The target's sparse next-token distribution at every position.

    hidden_states [T, H]: the target's last-layer states after the final norm (what feeds its LM head).
    head_weight [V, H]: the target's LM head. top_k: ids kept per position (capped at V).
    The head runs in chunks of `chunk_tokens` positions, in the head's dtype, with fp32 softmax; labels are on CPU.
    """
    if top_k < 1:
        raise ValueError(f"teacher_labels needs top_k >= 1, got {top_k}")
    parts = []
    for start in range(0, hidden_states.shape[0], chunk_tokens):
        hidden = hidden_states[start : start + chunk_tokens].to(device=head_weight.device, dtype=head_weight.dtype)
        parts.append(labels_from_logits(torch.nn.functional.linear(hidden, head_weight), top_k))
    if not parts:
        return empty_labels(min(top_k, head_weight.shape[0]))
    return TeacherLabels.cat(parts)


@torch.no_grad()
def labels_from_logits(logits: torch.Tensor, top_k: int, *, chunk_tokens: int = LABEL_CHUNK_TOKENS) -> TeacherLabels:
    """The sparse labels of the target's own logits [T, V] (e.g. those its forward already computed), on CPU; fp32
    softmax in chunks of `chunk_tokens` positions. `logits` is not modified."""
    if top_k < 1:
        raise ValueError(f"labels_from_logits needs top_k >= 1, got {top_k}")
    k = min(top_k, logits.shape[-1])
    parts = []
    for start in range(0, logits.shape[0], chunk_tokens):
        log_probs = logits[start : start + chunk_tokens].float().log_softmax(-1)  # [c, V], a new tensor
        top_log_probs, top_ids = log_probs.topk(k, dim=-1)
        # The rest's mass from the logits outside the top-k, not 1 - sum(top): exact even when the top-k hold
        # nearly all of it (1 - 0.9999999 in fp32 is mostly rounding).
        log_probs.scatter_(-1, top_ids, float("-inf"))
        rest = log_probs.logsumexp(-1).exp() if k < log_probs.shape[-1] else torch.zeros(log_probs.shape[0])
        parts.append(TeacherLabels(top_ids.cpu(), top_log_probs.cpu(), rest.to("cpu", torch.float32)))
    return TeacherLabels.cat(parts) if parts else empty_labels(k)


def empty_labels(top_k: int) -> TeacherLabels:
    empty = torch.zeros(0, top_k)
    return TeacherLabels(empty.long(), empty, torch.zeros(0))
