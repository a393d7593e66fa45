"""RolloutEngine: batched, KV-cached, continuously batched decoding with the torch model.

One `step()` either prefills newly admitted requests (producing their first token) or advances every running
request by one decode token, plainly or speculatively. Requests join and leave the running batch between steps.
The engine is single-threaded by design; `add_request` and `abort` are safe to call from other threads.

It is four rooms (as nano-vllm's): the scheduler (engine.scheduler: waiting and running requests, cache slots),
the model runner (engine.model_runner: the target's forwards, eager, compiled, CUDA graphs, CPU kernels), the
sampler (engine.sampler) and the speculative step (engine.speculative_step: draft, verify, commit, draft-source
health), with the draft sources in engine.drafts and every knob in one EngineConfig (engine.config). This file joins
them and holds the plain-or-speculative choice of each decode step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import torch

from verl_tlt.engine.checks import check_prompt, check_strategy
from verl_tlt.engine.config import EngineConfig, with_options
from verl_tlt.engine.cuda_graphs import StepGraphPool
from verl_tlt.engine.drafts.base import Drafter
from verl_tlt.engine.drafts.group import GroupDrafts
from verl_tlt.engine.kv_cache import SlotKVCache
from verl_tlt.engine.model_runner import ModelRunner
from verl_tlt.engine.request import CompletionOutput, Request
from verl_tlt.engine.sampler import BatchSampler
from verl_tlt.engine.sampling_params import SamplingParams
from verl_tlt.engine.scheduler import Scheduler
from verl_tlt.engine.speculative_step import SpeculativeStep
from verl_tlt.modeling.model import CausalLM
from verl_tlt.modeling.weights import load_pretrained, load_weights, read_eos_token_ids
from verl_tlt.policy import PLAIN, DecodeStats, Policy
from verl_tlt.policy.decode_stats import DecodeCosts
from verl_tlt.progress import Progress
from verl_tlt.spec.strategy import SpecStrategy


class RolloutEngine:
    """The engine. Its knobs are one `EngineConfig` (engine.config: fields with their help), passed whole or as
    keywords that override it (`RolloutEngine(model, eos_token_ids=..., max_num_seqs=8)`); besides them:

    drafter: the draft model of EAGLE strategies (engine.drafts), or None; `set_drafter` swaps it between calls.
    policy: chooses plain or speculative per decode step when generate/step get no explicit strategy (it needs a
        draft source: until one is attached every step is plain).
    group_drafts: model-free drafts from each request's group (engine.drafts.group), for strategies whose source is
        suffix or mixed; made with defaults when such a strategy is first asked for. Requests join a group through
        `add_request(..., group=key)` or `generate(..., groups=[...])`.

    With the default keyed sampling, plain and speculative decoding emit the same tokens under the same noise keys,
    whatever the batch, strategy or drafter; a request's key comes from its seed, or else from the engine's seed and
    the order requests arrive in. Drafts are the drafter's own Gumbel-max draws with the same noise (chains; trees are
    the drafter's top-k), and verification accepts a draft exactly when it is the target's draw.
    """

    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig | None = None,
        *,
        eos_token_ids: Sequence[int],
        drafter: Drafter | None = None,
        policy: Policy | None = None,
        group_drafts: GroupDrafts | None = None,
        **options: Any,
    ):
        self.config = config = with_options(config or EngineConfig(), options)
        self.scheduler = Scheduler(config.max_num_seqs)
        self.max_model_len = config.max_model_len or model.spec.max_position_embeddings
        self.max_draft_tokens = config.max_draft_tokens
        # Draft-tree nodes are verified in scratch positions after a row's prefix, hence the extra room.
        self.runner = ModelRunner(model, config, cache_len=self.max_model_len + config.max_draft_tokens + 1)
        self.model, self.device, self.dtype = self.runner.model, self.runner.device, self.runner.dtype
        self.sampler = BatchSampler(
            keyed=config.sampling == "keyed",
            raw_logprobs=config.logprobs_mode == "raw_logprobs",
            seed=config.seed,
            device=self.device,
        )
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.speculation = SpeculativeStep(self.runner, self.sampler, group_drafts)
        self.set_drafter(drafter)
        self.policy = policy  # validated by the setter below
        self.stats = DecodeStats()
        self.decode_costs = DecodeCosts()  # by batch-size group and arm, taken by whoever reports them

    @classmethod
    def from_pretrained(
        cls, path: str, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, **kwargs
    ) -> RolloutEngine:
        """Build the engine from a local transformers checkpoint directory (kwargs: see __init__ and EngineConfig).

        drafter may be a Drafter or the path of an exported EAGLE or EAGLE-3 drafter (`verl-tlt drafter warmup`
        output), which is loaded against this target (shared embedding and LM head).
        """
        model, config = load_pretrained(path, device=device, dtype=dtype)
        kwargs.setdefault("eos_token_ids", read_eos_token_ids(path, config))
        drafter = kwargs.pop("drafter", None)
        engine = cls(model, **kwargs)
        if isinstance(drafter, (str, os.PathLike)):
            from verl_tlt.drafter.family import load_drafter
            from verl_tlt.engine.drafts.eagle import EagleDrafter

            drafter = EagleDrafter(load_drafter(str(drafter), model), max_len=engine.cache.max_len)
        engine.set_drafter(drafter)
        return engine

    # ----- parts, as callers and tests see them ---------------------------------------------------------

    @property
    def running(self) -> list[Request]:
        return self.scheduler.running

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def max_num_seqs(self) -> int:
        return self.scheduler.max_num_seqs

    @max_num_seqs.setter
    def max_num_seqs(self, value: int) -> None:
        """Benchmarks resize the running batch between generate calls; the cache grows on demand."""
        self.scheduler.max_num_seqs = value

    @property
    def cache(self) -> SlotKVCache:
        return self.runner.cache

    @property
    def drafter(self) -> Drafter | None:
        return self.speculation.drafter

    @property
    def drafter_error(self) -> str | None:
        return self.speculation.drafter_error

    @property
    def group_drafts(self) -> GroupDrafts | None:
        return self.speculation.group_drafts

    @group_drafts.setter
    def group_drafts(self, group_drafts: GroupDrafts | None) -> None:
        self.speculation.group_drafts, self.speculation.group_drafts_error = group_drafts, None

    def set_drafter(self, drafter: Drafter | None) -> None:
        """Attach (or with None, detach) the draft model used by speculative steps, between generate calls."""
        if self.scheduler.has_unfinished():
            raise RuntimeError(
                "Cannot change the drafter while requests are in flight: the new drafter has not seen their context"
            )
        if drafter is not None and drafter.vocab_size != self.model.spec.vocab_size:
            raise ValueError(
                f"Drafter vocabulary ({drafter.vocab_size}) differs from the target's ({self.model.spec.vocab_size}); "
                "the torch engine needs a drafter over the target's vocabulary"
            )
        self.speculation.set_drafter(drafter)
        layers = drafter.feature_layers if drafter is not None else ()
        if layers != self.model.feature_layers:
            self.model.feature_layers = layers  # the target's forward now returns what this drafter reads
            if self.runner.graphs is not None:
                self.runner.graphs.reset()  # captured with the previous output width

    @property
    def policy(self) -> Policy | None:
        return self._policy

    @policy.setter
    def policy(self, policy: Policy | None) -> None:
        """Attach an adaptive policy; its strategies must fit this engine as an explicit strategy must."""
        if policy is not None:
            for strategy in policy.strategies.values():
                self._check_strategy(strategy, needs_drafter=False)
        self._policy = policy

    # ----- requests -----------------------------------------------------------------------------------------

    def add_request(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        group: Hashable | None = None,
    ) -> str:
        """Queue a request. group: a key shared by requests whose answers draft for each other (one GRPO prompt's
        samples); None drafts (suffix and mixed strategies) from the request's own tokens only."""
        self._check_prompt(prompt_ids)
        return self._enqueue(prompt_ids, params, request_id, group)

    def _enqueue(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        group: Hashable | None = None,
    ) -> str:
        """Queue a prompt that `_check_prompt` has passed."""
        request_id = request_id if request_id is not None else self.scheduler.new_request_id()
        generator = self.sampler.request_generator(params)
        request = Request(request_id, [int(t) for t in prompt_ids], params, generator, self.max_model_len)
        stop_ids = params.stop_token_ids
        request.stop_ids = frozenset(stop_ids) if params.ignore_eos else self.eos_token_ids.union(stop_ids)
        request.group = group
        self.scheduler.enqueue(request, self.sampler.assign_key)
        return request_id

    def _check_prompt(self, prompt_ids: Sequence[int]) -> None:
        check_prompt(prompt_ids, self.max_model_len, self.model.spec.vocab_size)

    def abort(self, request_id: str) -> None:
        """Finish a request early with finish_reason 'abort' at the next step."""
        self.scheduler.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ----- stepping ----------------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, strategy: SpecStrategy | str | None = None) -> list[CompletionOutput]:
        """Run one prefill or decode step; return the requests that finished in it.

        strategy: decode this step speculatively with the drafter (a SpecStrategy or 'depth_topk_treetokens').
        None decodes plainly, or, when an adaptive policy is attached, lets the policy choose. Prefill steps
        ignore it. Any step may switch, for any batch.
        """
        checked = self._check_strategy(strategy)
        finished = self.scheduler.collect_aborted()
        admitted = self.scheduler.admit()
        if admitted:
            self._prefill(admitted)
        elif self.scheduler.running:
            self._decode_step(checked)
        return finished + self.scheduler.retire_finished(self._move_slot, self._on_retire)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
        strategy: SpecStrategy | str | None = None,
        progress: Progress | None = None,
        groups: Sequence[Hashable | None] | None = None,
    ) -> list[CompletionOutput]:
        """Generate completions for a list of token-id prompts; outputs are in prompt order.

        groups: a group key per prompt (see add_request), or None for none.
        strategy: speculative strategy for every decode step (needs a drafter), or None for plain decoding.
        progress: told the number of finished requests after every step (for long untimed generations; a timed
        call leaves it out).
        """
        checked = self._check_strategy(strategy)
        params_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(params_list) != len(prompts):
            raise ValueError(f"Got {len(prompts)} prompts but {len(params_list)} SamplingParams")
        groups = [None] * len(prompts) if groups is None else list(groups)
        if len(groups) != len(prompts):
            raise ValueError(f"Got {len(prompts)} prompts but {len(groups)} groups")
        for prompt in prompts:  # all checked before any is queued: a bad one must not leave the others behind
            self._check_prompt(prompt)
        ids = [self._enqueue(p, sp, None, g) for p, sp, g in zip(prompts, params_list, groups, strict=True)]
        done: dict[str, CompletionOutput] = {}
        while len(done) < len(ids):
            for output in self.step(checked):
                done[output.request_id] = output
            if progress is not None:
                progress.update(len(done))
        return [done[i] for i in ids]

    # ----- weights and memory ------------------------------------------------------------------------------

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load updated weights (transformers names) between steps; returns how many tensors were loaded."""
        return load_weights(self.model, named_tensors, strict=False)

    def reset(self) -> None:
        """Drop every request (waiting and running) without outputs; used after an unrecoverable step error."""
        self.scheduler.reset()
        if self.drafter is not None:
            self.drafter.reset()
        if self.group_drafts is not None:
            self.group_drafts.reset()

    def release_cache(self) -> None:
        if self.scheduler.has_unfinished():
            raise RuntimeError("Cannot release the KV cache while requests are in flight")
        self.runner.release_cache()
        if self.drafter is not None:
            self.drafter.release_cache()

    def enable_step_graphs(self, capture: bool = True) -> StepGraphPool:
        """Serve decode and verify forwards from a StepGraphPool from now on (what cuda_graphs=True does lazily).

        Plain decode is served at every batch bucket up to max_num_seqs; with an adaptive policy, verify steps only
        for its strategies' widths and up to its threshold, otherwise any. capture=False replays the static-shape
        path eagerly (off CUDA: tests of the padding and masks).
        """
        widths = verify_max_batch = None
        if self.policy is not None:
            widths = {strategy.tree_tokens + 1 for strategy in self.policy.strategies.values()}
            verify_max_batch = self.policy.threshold
        return self.runner.enable_step_graphs(self.max_num_seqs, widths, verify_max_batch, capture)

    # ----- one step ----------------------------------------------------------------------------------------

    def _prefill(self, requests: list[Request]) -> None:
        hidden = self.runner.prefill([r.prompt_ids for r in requests], row_start=self.num_running)  # [N, T, H]
        lengths = [len(r.prompt_ids) for r in requests]
        last = torch.tensor(lengths, device=self.device) - 1
        logits = self.runner.logits(hidden[torch.arange(len(requests)), last])  # [N, V]
        if self.speculation.records_hidden:
            for row, request in enumerate(requests):
                request.pending_hidden.append(hidden[row, : lengths[row]].clone())
        self.scheduler.start(requests)
        self.sampler.emit(requests, logits)
        if self.group_drafts is not None:
            self.group_drafts.admit(requests)

    def _decode(self) -> None:
        running = self.scheduler.running
        hidden = self.runner.decode([r.output_ids[-1] for r in running], self.scheduler.cache_lens)
        logits = self.runner.logits(hidden[:, -1])
        self.scheduler.cache_lens = [n + 1 for n in self.scheduler.cache_lens]
        records_hidden = self.speculation.records_hidden
        for row, request in enumerate(running):
            request.num_decode_steps += 1
            if records_hidden:
                request.pending_hidden.append(hidden[row, -1:].clone())
        self.sampler.emit(running, logits)

    def _decode_step(self, forced: SpecStrategy | None) -> None:
        """One decode step, plain or speculative; the adaptive policy (if any) chooses and learns."""
        if self.runner.wants_graphs and self.runner.graphs is None:
            self.enable_step_graphs()
        running, batch_size = self.scheduler.running, self.num_running
        asks_policy = forced is None and self.policy is not None and self.speculation.can_speculate
        chosen = self.policy.select(batch_size) if asks_policy else forced
        rows = list(running)
        positions = [len(r.output_ids) for r in rows]
        before, start = sum(positions), time.perf_counter()
        outcome = self.speculation.run(chosen, self.scheduler, self.stats)
        if not outcome.speculated:
            self._decode()
        seconds, committed = time.perf_counter() - start, sum(len(r.output_ids) for r in running) - before
        if outcome.speculated:
            self.stats.record_positions(
                positions, [len(r.output_ids) - n for r, n in zip(rows, positions, strict=True)]
            )
        if asks_policy:
            self.policy.observe(outcome.arm, batch_size, committed, seconds)
        self.stats.record(outcome.arm, batch_size, committed, seconds, self.policy)
        self.decode_costs.record(PLAIN if outcome.arm is None else outcome.arm.name, batch_size, committed, seconds)

    def _move_slot(self, src: int, dst: int, length: int) -> None:
        self.runner.move_slot(src, dst, length)
        if self.drafter is not None:
            self.drafter.move_slot(src, dst)

    def _on_retire(self, request: Request) -> None:
        if self.group_drafts is not None:
            self.group_drafts.retire(request)

    def _check_strategy(self, strategy: SpecStrategy | str | None, needs_drafter: bool = True) -> SpecStrategy | None:
        if strategy is None:
            return None
        parsed = SpecStrategy.parse(strategy)
        if parsed.uses_group_drafts:
            self.speculation.ensure_group_drafts(self.num_running)
        has_drafter = self.drafter is not None if needs_drafter else None
        vocab_size = self.model.spec.vocab_size
        check_strategy(parsed, has_drafter=has_drafter, max_draft_tokens=self.max_draft_tokens, vocab_size=vocab_size)
        return parsed
