"""Batched token sampling from raw logits, with per-request parameters and generators."""

from __future__ import annotations

import torch

from verl_tlt.engine.request import Request
from verl_tlt.spec.logits import LogitsParams, first_argmax, token_log_probs


def params_tensors(requests: list[Request], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N] temperature, top_k, top_p tensors for a batch of requests."""
    temperature = torch.tensor([r.params.temperature for r in requests], dtype=torch.float32, device=device)
    top_k = torch.tensor([r.params.top_k for r in requests], dtype=torch.long, device=device)
    top_p = torch.tensor([r.params.top_p for r in requests], dtype=torch.float32, device=device)
    return temperature, top_k, top_p


def sample_tokens(
    logits: torch.Tensor,
    requests: list[Request],
    params: LogitsParams,
    default_generator: torch.Generator,
    *,
    raw_logprobs: bool,
    noise: torch.Tensor | None = None,
) -> tuple[list[int], list[float]]:
    """Sample one token per row of logits [N, V]; return token ids and their log-probs.

    Log-probs come from the processed distribution (vLLM's `processed_logprobs`) unless raw_logprobs.
    With `noise` [N, V] (keyed Gumbel noise, zero on greedy rows) each row takes argmax(processed + noise): keyed
    sampling, which needs no generator. Otherwise each request with a seed draws from its own generator, so its
    samples do not depend on batch composition, and the others share `default_generator`.
    """
    processed = params.process(logits)  # [N, V] fp32
    tokens = first_argmax(processed if noise is None else processed + noise)
    greedy = params.greedy_rows
    if noise is None and not all(greedy):
        probs = processed.softmax(dim=-1)
        for row, request in enumerate(requests):
            if greedy[row]:
                continue
            generator = request.generator or default_generator
            tokens[row] = torch.multinomial(probs[row], 1, generator=generator)[0]
    log_probs = token_log_probs(logits if raw_logprobs else processed, tokens)
    return tokens.tolist(), log_probs.tolist()
