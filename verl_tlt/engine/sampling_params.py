"""Sampling parameters of one request, with vLLM's names and defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """What to sample and when to stop.

    temperature 0 is greedy. top_k <= 0 disables top-k; top_p = 1.0 disables top-p. Generation stops at an EOS
    token (unless ignore_eos), at any of stop_token_ids (the stop token is kept in the output, as vLLM does), or
    after max_tokens tokens. seed fixes this request's samples: with the engine's default keyed sampling they are the
    same whatever the request is batched with and whatever mix of plain and speculative steps decodes it (without a
    seed, the engine's seed and the order requests arrive in pick the key). Under `sampling="rejection"` a
    speculative step consumes random draws differently from a plain one, so there the samples, while always from
    the target's distribution, depend on the steps' strategies.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"SamplingParams.temperature must be finite and >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if self.repetition_penalty != 1.0:
            raise ValueError(
                f"SamplingParams.repetition_penalty={self.repetition_penalty} is not supported by the torch rollout "
                "engine (it would break lossless speculative decoding); use repetition_penalty=1.0."
            )
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in (self.stop_token_ids or ())))

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-5

    @classmethod
    def from_request_dict(cls, params: dict[str, Any], *, default_max_tokens: int) -> SamplingParams:
        """Build from the sampling dict verl's agent loop sends (vLLM keys); unknown keys are an error."""
        params = dict(params)
        params.pop("logprobs", None)  # log-probs are always returned
        if "max_new_tokens" in params:
            params.setdefault("max_tokens", params.pop("max_new_tokens"))
        params.setdefault("max_tokens", default_max_tokens)
        if params.get("top_k") is None:
            params["top_k"] = -1
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(
                f"Unsupported sampling parameter(s) {unknown} for the torch rollout engine; supported: {sorted(known)}"
            )
        return cls(**params)
