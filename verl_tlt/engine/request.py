"""Per-request state inside the engine, and what a finished request returns."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import torch

from verl_tlt.engine.sampling_params import SamplingParams


@dataclass
class CompletionOutput:
    """A finished request. finish_reason: 'stop' (EOS or stop token), 'length' (max_tokens or context), 'abort'.

    stats: num_decode_steps (plain + speculative), num_output_tokens, and for speculative decoding
    num_verify_steps, num_draft_tokens (draft tokens verified) and num_accepted_tokens. Tokens per verify step
    including the bonus token (the acceptance length) is (num_accepted_tokens + num_verify_steps) / num_verify_steps.
    """

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str
    stop_token_id: int | None = None
    stats: dict[str, int] = field(default_factory=dict)


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    max_total_len: int
    output_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_token_id: int | None = None
    # Token ids that end this request (EOS unless ignore_eos, plus stop_token_ids), fixed when it is added.
    stop_ids: frozenset[int] = frozenset()
    num_decode_steps: int = 0
    # Speculative decoding: verify steps, draft tokens verified, draft tokens accepted.
    num_verify_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # Drafter sync: positions the drafter has consumed, and target hidden states of the positions after them.
    num_drafter_synced: int = 0
    pending_hidden: list[torch.Tensor] = field(default_factory=list)
    # Keyed sampling: the key of this request's Gumbel noise (spec.keyed_noise.request_key), set when it is queued.
    noise_key: int = 0
    # Group drafts: the caller's group key (requests sharing it are siblings, e.g. one GRPO prompt's samples; None =
    # its own group), and the request's document in its group's suffix index (engine.drafts.group), once admitted.
    group: Hashable | None = None
    draft_doc: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def last_token_id(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    def append(self, token_id: int, log_prob: float, stop_ids: frozenset[int]) -> None:
        """Record one emitted token and decide whether the request is finished."""
        self.output_ids.append(token_id)
        self.log_probs.append(log_prob)
        if token_id in stop_ids:
            self.finish_reason, self.stop_token_id = "stop", token_id
        elif len(self.output_ids) >= self.params.max_tokens or self.num_tokens >= self.max_total_len:
            self.finish_reason = "length"

    def to_output(self) -> CompletionOutput:
        return CompletionOutput(
            request_id=self.request_id,
            prompt_token_ids=list(self.prompt_ids),
            token_ids=list(self.output_ids),
            log_probs=list(self.log_probs),
            finish_reason=self.finish_reason or "abort",
            stop_token_id=self.stop_token_id,
            stats={
                "num_decode_steps": self.num_decode_steps,
                "num_output_tokens": len(self.output_ids),
                "num_verify_steps": self.num_verify_steps,
                "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
            },
        )
