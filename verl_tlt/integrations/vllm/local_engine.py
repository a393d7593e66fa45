"""A TLT-configured vLLM engine in this process, outside verl: for ``verl-tlt bench sd vllm`` and the
vLLM test tier.

It assembles the engine exactly like the TLT server does inside verl (``engine_setup``): EAGLE-1 drafter from an
export, the per-batch-size K schedule from ``tlt.speculative``, TLT's worker extension (in-place drafter loads),
stat logging on with TLT's spec-decode logger. Token ids in, token ids out (no tokenizer): answers stop at the
model's end-of-sequence ids as the torch engine reads them (``config.json`` and ``generation_config.json``; vLLM
without a tokenizer reads only the latter).

vLLM starts its engine core in a child process: scripts that construct this must run under
``if __name__ == "__main__":``, and callers should bound everything with a timeout (a crashed engine core can leave
the caller waiting forever).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from verl_tlt.config import SpeculativeConfig
from verl_tlt.engine.drafts.self_test import DrafterSelfTest, Verdict
from verl_tlt.integrations.vllm.engine_setup import TLT_WORKER_EXTENSION, cpu_engine_env, speculative_engine_args
from verl_tlt.integrations.vllm.self_test import probe_vllm_drafter
from verl_tlt.integrations.vllm.spec_stats import SpecStepCounter, stat_logger_factory
from verl_tlt.modeling.weights import read_eos_token_ids

# A generate call that finishes nothing for this long is treated as a hung engine (the toy's calls take seconds).
GENERATE_TIMEOUT_ENV = "VERL_TLT_VLLM_GENERATE_TIMEOUT_S"
GENERATE_TIMEOUT_S = float(os.environ.get(GENERATE_TIMEOUT_ENV, "300"))


@dataclass
class Generation:
    token_ids: list[list[int]]
    log_probs: list[list[float]] | None
    seconds: float


class LocalVllmEngine:
    def __init__(
        self,
        model: str,
        *,
        drafter_dir: str | None = None,
        speculative: SpeculativeConfig | None = None,
        max_num_seqs: int = 64,
        max_model_len: int = 1024,
        dtype: str = "float32",
        seed: int = 0,
        schedule: list[list[int]] | None = None,
        num_speculative_tokens: int | None = None,
        adaptive: bool = False,
        static: bool = False,
        catch_up_window: int | None = None,
        num_kv_blocks: int | None = None,
        skip_empty_draft_fetch: bool | None = None,
    ):
        """drafter_dir None: plain decoding. schedule / num_speculative_tokens override what `speculative` gives
        (a fixed K for benchmarks: schedule [[1, max_num_seqs, K]]). adaptive: TLT's per-step K policy
        (``k_scheduler``) instead of the static schedule. static: vLLM's own SD, K = the deepest chain at every
        step with no per-batch-size schedule (what a user who sets only ``speculative_config`` gets).
        catch_up_window: K=0 steps skip the drafter, which catches up when it next runs (``deferred_first_pass``);
        None = ``speculative.vllm_catch_up_window``, 0 = vLLM's first pass every step. num_kv_blocks: the KV cache's
        size in blocks (None: what the host's memory gives; small values make vLLM preempt requests).
        skip_empty_draft_fetch: no draft fetch after a K=0 step (``empty_draft_fetch``; None: where deferral is on)."""
        self.model = model
        self.eos_token_ids = model_eos_token_ids(model)
        cpu_engine_env()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.speculative = speculative or SpeculativeConfig()
        self.counter = SpecStepCounter(self.speculative.gate)
        window = self.speculative.vllm_catch_up_window if catch_up_window is None else catch_up_window
        kwargs: dict[str, Any] = {}
        if drafter_dir is not None:
            kwargs = speculative_engine_args(
                self.speculative,
                drafter_dir,
                max_num_seqs,
                adaptive=adaptive,
                catch_up_window=window,
                skip_empty_draft_fetch=skip_empty_draft_fetch,
            )
            spec = kwargs["speculative_config"]
            if num_speculative_tokens is not None:
                spec["num_speculative_tokens"] = num_speculative_tokens
            if schedule is not None:
                spec["num_speculative_tokens_per_batch_size"] = schedule
            if static:
                spec.pop("num_speculative_tokens_per_batch_size", None)
        args = AsyncEngineArgs(
            model=model,
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            seed=seed,
            disable_log_stats=False,
            worker_extension_cls=TLT_WORKER_EXTENSION,
            num_gpu_blocks_override=num_kv_blocks,
            **kwargs,
        )
        self._loop = asyncio.new_event_loop()
        self._ids = itertools.count()
        self.engine = AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger_factory(self.counter)])
        self.catch_up: list[dict] = []  # each worker's answer to the install (empty: not asked)
        if drafter_dir is not None and window > 0:
            self.catch_up = self._rpc("tlt_install_catch_up", window)

    def _rpc(self, method: str, *args: Any) -> list:
        return self._loop.run_until_complete(self.engine.collective_rpc(method, args=args))

    def catch_up_stats(self) -> list[dict]:
        """Each worker's deferral counts (``DeferredFirstPass.stats``): deferred steps, catch-ups, tokens."""
        return self._rpc("tlt_catch_up_stats")

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int | list[int],
        *,
        temperature: float = 0.0,
        seed: int | None = None,
        logprobs: bool = False,
    ) -> Generation:
        """All prompts submitted at once (one batch that drains: a rollout's shape); token ids per prompt.
        `max_tokens`: one cap for all, or one per prompt.

        Bounded by ``GENERATE_TIMEOUT_S``: an engine core that died or stalls raises here, naming the call, instead
        of leaving the caller waiting forever."""
        call = self._generate(prompts, max_tokens, temperature, seed, logprobs)
        try:
            return self._loop.run_until_complete(asyncio.wait_for(call, GENERATE_TIMEOUT_S))
        except TimeoutError as error:
            raise TimeoutError(
                f"vLLM engine for {self.model} produced no complete output for {len(prompts)} prompts x {max_tokens} "
                f"tokens within {GENERATE_TIMEOUT_S:.0f} s (its engine core died or stalls; its log is above). "
                f"Raise {GENERATE_TIMEOUT_ENV} for a slower machine."
            ) from error

    async def _generate(self, prompts, max_tokens, temperature, seed, logprobs) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        caps = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
        if len(caps) != len(prompts):
            raise ValueError(f"max_tokens has {len(caps)} caps for {len(prompts)} prompts")

        async def one(index: int, prompt: list[int]):
            params = SamplingParams(
                max_tokens=caps[index],
                temperature=temperature,
                seed=None if seed is None else seed + index,
                detokenize=False,
                logprobs=0 if logprobs else None,
                stop_token_ids=self.eos_token_ids,
            )
            final = None
            async for output in self.engine.generate(
                TokensPrompt(prompt_token_ids=prompt), params, f"r{next(self._ids)}"
            ):
                final = output
            completion = final.outputs[0]
            ids = list(completion.token_ids)
            lps = [step[t].logprob for t, step in zip(ids, completion.logprobs, strict=True)] if logprobs else None
            return ids, lps

        began = time.perf_counter()
        results = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        seconds = time.perf_counter() - began
        return Generation([ids for ids, _ in results], [lps for _, lps in results] if logprobs else None, seconds)

    def load_drafter(self, path: str, version: int) -> list[dict]:
        """Load the export at `path` into every worker's drafter in place; each worker's result."""
        return self._rpc("tlt_load_drafter", path, version)

    def self_test(self, test: DrafterSelfTest) -> Verdict:
        """The replicas' drafter self-test (``vllm.self_test``) on the drafter this engine runs now."""

        async def request(prompt: list[int], tokens: int) -> Generation:
            return await self._generate([prompt], tokens, 0.0, None, False)

        probe = probe_vllm_drafter(test, self.counter, request)
        return self._loop.run_until_complete(asyncio.wait_for(probe, GENERATE_TIMEOUT_S))

    def take_stats(self, reset: bool = True) -> dict:
        return self.counter.take_stats(reset)

    def close(self) -> None:
        self.engine.shutdown()
        # vLLM's output handler still runs on this loop: cancel it before closing, or it logs errors at exit.
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()


def model_eos_token_ids(model: str) -> list[int]:
    """The end-of-sequence ids the torch engine stops at for the model folder `model` ([] if it names none)."""
    config_file = Path(model) / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    return read_eos_token_ids(model, SimpleNamespace(eos_token_id=config.get("eos_token_id")))
