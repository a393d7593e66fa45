"""The one logits-processing function shared by plain decoding, drafting and verification.

Plain decoding, the drafter and the verifier must see exactly the same target distribution, or speculative
decoding stops being lossless. Every path therefore turns raw logits into a distribution through
`process_logits` and nothing else.

Conventions follow vLLM (which verl's vLLM rollout uses with `logprobs_mode=processed_logprobs`):
- temperature 0 means greedy; the distribution used for log-probs is then the untempered one (scale 1.0);
- top-k <= 0 or >= vocab disables top-k; top-p >= 1 disables top-p;
- top-k is applied before top-p, and masked tokens get -inf logits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

GREEDY_EPS = 1e-5


def process_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """Apply temperature, top-k and top-p per row; return processed fp32 logits (masked entries are -inf).

    Args:
        logits: [N, V] raw logits (any float dtype).
        temperature: [N] float; values below GREEDY_EPS mean greedy and are treated as 1.0 here.
        top_k: [N] int; <= 0 or >= V disables top-k for that row.
        top_p: [N] float in (0, 1]; 1.0 disables top-p for that row.

    Returns:
        [N, V] float32 processed logits. `log_softmax` of it gives the processed log-probs.
    """
    logits = logits.float()
    vocab_size = logits.shape[-1]
    scale = torch.where(temperature < GREEDY_EPS, torch.ones_like(temperature), temperature).float()
    logits = logits / scale.unsqueeze(-1)

    use_top_k = (top_k > 0) & (top_k < vocab_size)
    use_top_p = top_p < 1.0
    if not bool(use_top_k.any()) and not bool(use_top_p.any()):
        return logits

    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)  # [N, V]
    remove_sorted = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if bool(use_top_k.any()):
        k = torch.where(use_top_k, top_k, torch.full_like(top_k, vocab_size)).clamp(min=1)
        ranks = torch.arange(vocab_size, device=logits.device).unsqueeze(0)
        remove_sorted |= ranks >= k.unsqueeze(-1)
    if bool(use_top_p.any()):
        masked_sorted = sorted_logits.masked_fill(remove_sorted, float("-inf"))
        sorted_probs = masked_sorted.softmax(dim=-1)
        # Mass strictly before each token: a token is kept while the mass before it is < top_p,
        # so the most likely token always survives.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        remove_sorted |= use_top_p.unsqueeze(-1) & (mass_before >= top_p.unsqueeze(-1).float())
    remove = torch.zeros_like(remove_sorted).scatter(-1, sorted_idx, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def is_greedy(temperature: torch.Tensor) -> torch.Tensor:
    """[N] bool: rows whose temperature means greedy decoding."""
    return temperature < GREEDY_EPS


def first_argmax(values: torch.Tensor) -> torch.Tensor:
    """`values.argmax(dim=-1)`: the index of the first maximal entry of each row (NaN counting as maximal).

    On the CPU this is `max`'s indices, which are the same by definition and were about 3x faster than `argmax` over
    a 32000-entry vocab in torch 2.13 (0.1 vs 0.3 ms at 16 rows, a few percent of a small model's decode step)."""
    if values.device.type == "cpu":
        return values.max(dim=-1).indices
    return values.argmax(dim=-1)


def token_log_probs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """[N] log-probs of token_ids [N] under the rows of logits [N, V] (processed or raw, as the caller chooses)."""
    return logits.float().log_softmax(dim=-1).gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)


@dataclass(frozen=True)
class LogitsParams:
    """Per-row sampling parameters as tensors, so drafting and verification process logits like the sampler."""

    temperature: torch.Tensor  # [B] float
    top_k: torch.Tensor  # [B] long
    top_p: torch.Tensor  # [B] float

    @classmethod
    def from_lists(
        cls, temperature: list[float], top_k: list[int], top_p: list[float], device: torch.device | str = "cpu"
    ) -> LogitsParams:
        return cls(
            torch.tensor(temperature, dtype=torch.float32, device=device),
            torch.tensor(top_k, dtype=torch.long, device=device),
            torch.tensor(top_p, dtype=torch.float32, device=device),
        )

    @property
    def is_greedy(self) -> torch.Tensor:
        return is_greedy(self.temperature)

    @functools.cached_property
    def greedy_rows(self) -> list[bool]:
        """Per-row greedy flags as Python bools (computed once; the engine reuses params while its batch holds)."""
        return self.is_greedy.tolist()

    @functools.cached_property
    def _scale(self) -> torch.Tensor:
        """[B, 1] divisor: the temperature, or 1.0 for greedy rows (as in process_logits)."""
        return torch.where(self.is_greedy, torch.ones_like(self.temperature), self.temperature).float().unsqueeze(-1)

    @functools.cached_property
    def _unit_scale(self) -> bool:
        """Whether every row's divisor is 1.0 (greedy rows, temperature 1): dividing would change no value."""
        return bool((self._scale == 1.0).all())

    @functools.cached_property
    def _filters(self) -> bool:
        """Whether any row uses top-k or top-p; rows without either need only the temperature."""
        # top_k >= vocab is a no-op too, but the vocab is unknown here; process_logits sorts that out.
        return bool((self.top_k > 0).any()) or bool((self.top_p < 1.0).any())

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """process_logits for logits [B, V] or [B, M, V] (every position of row b uses row b's parameters)."""
        if not self._filters:  # the common RL case: one division, decided once per batch composition
            if self._unit_scale:  # x / 1.0 is x exactly: skip a pass over [B, V] (callers never write into it)
                return logits.float()
            scale = self._scale if logits.dim() == 2 else self._scale.unsqueeze(-1)
            return logits.float() / scale
        if logits.dim() == 2:
            return process_logits(logits, self.temperature, self.top_k, self.top_p)
        rows, positions, vocab = logits.shape
        flat = process_logits(
            logits.reshape(rows * positions, vocab),
            self.temperature.repeat_interleave(positions),
            self.top_k.repeat_interleave(positions),
            self.top_p.repeat_interleave(positions),
        )
        return flat.view(rows, positions, vocab)
