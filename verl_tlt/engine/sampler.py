"""Batched token sampling from raw logits, with per-request parameters and generators or keyed noise."""

from __future__ import annotations

import numpy as np
import torch

from verl_tlt.engine.request import Request
from verl_tlt.engine.sampling_params import SamplingParams
from verl_tlt.spec.keyed_noise import gumbel_noise, request_key
from verl_tlt.spec.logits import LogitsParams, first_argmax, token_log_probs


class BatchSampler:
    """How the engine draws tokens for a batch of requests (see EngineConfig.sampling).

    keyed: sampled rows take argmax(processed logits + Gumbel noise keyed by (request key, token position)), so
    plain and speculative steps emit the same tokens; otherwise each seeded request draws from its own generator
    and the rest from the engine's.
    """

    def __init__(self, *, keyed: bool, raw_logprobs: bool, seed: int, device: torch.device):
        self.keyed = keyed
        self.raw_logprobs = raw_logprobs
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._params_cache: tuple[tuple[int, ...], LogitsParams, list[Request]] | None = None

    def request_generator(self, params: SamplingParams) -> torch.Generator | None:
        """A seeded request's own generator (rejection sampling only: keyed rows need none)."""
        if params.seed is None or self.keyed:
            return None
        return torch.Generator(device=self.device).manual_seed(params.seed)

    def assign_key(self, request: Request) -> None:
        """Give a keyed request its noise key: from its seed, or else the engine's next draw (call in arrival order)."""
        if not self.keyed:
            return
        seed = request.params.seed
        if seed is None:
            seed = int(torch.randint(0, 1 << 62, (1,), generator=self.generator, device=self.device))
        request.noise_key = request_key(seed)

    def params(self, requests: list[Request]) -> LogitsParams:
        """Sampling parameters of `requests` as tensors, rebuilt only when the batch composition changes."""
        # Keyed by object identity; the cache keeps the requests alive, so their ids cannot be reused meanwhile.
        key = tuple(map(id, requests))
        if self._params_cache is None or self._params_cache[0] != key:
            self._params_cache = (key, LogitsParams(*params_tensors(requests, self.device)), list(requests))
        return self._params_cache[1]

    def noise(self, requests: list[Request], params: LogitsParams, width: int, vocab_size: int) -> torch.Tensor | None:
        """[B, width, V] keyed Gumbel noise for the next `width` token positions of every row (zero on greedy rows),
        or None when sampling is not keyed or every row is greedy."""
        greedy = params.greedy_rows
        if not self.keyed or all(greedy):
            return None
        keys = np.array([r.noise_key for r in requests], dtype=np.uint64)
        positions = np.array([r.num_tokens for r in requests], dtype=np.int64)[:, None] + np.arange(width)
        noise = gumbel_noise(keys, positions, vocab_size, self.device)
        if any(greedy):
            noise.masked_fill_(params.is_greedy.view(-1, 1, 1), 0.0)
        return noise

    def emit(self, requests: list[Request], logits: torch.Tensor) -> None:
        """Draw each row's next token from logits [N, V] and append it to its request."""
        params = self.params(requests)
        noise = self.noise(requests, params, 1, logits.shape[-1])
        tokens, log_probs = sample_tokens(
            logits,
            requests,
            params,
            self.generator,
            raw_logprobs=self.raw_logprobs,
            noise=None if noise is None else noise[:, 0],
        )
        for request, token, log_prob in zip(requests, tokens, log_probs, strict=True):
            if request.finish_reason is None:  # an aborted row waits for retirement without growing
                request.append(token, log_prob, request.stop_ids)


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
