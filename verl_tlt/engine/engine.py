"""RolloutEngine: batched, KV-cached, continuously batched decoding with the torch model.

One `step()` either prefills newly admitted requests (producing their first token) or advances every running
request by one decode token. Requests join and leave the running batch between steps. The engine is single-
threaded by design; `add_request` and `abort` are safe to call from other threads.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Hashable, Iterable, Sequence

import numpy as np
import torch

from verl_tlt.engine.compiled_forward import CompiledForward
from verl_tlt.engine.cpu_kernels import setup_cpu_kernels
from verl_tlt.engine.cuda_graphs import StepGraphPool, graph_batch_buckets
from verl_tlt.engine.drafter import Drafter
from verl_tlt.engine.group_drafts import GroupDraftError, GroupDrafts
from verl_tlt.engine.kv_cache import SlotKVCache
from verl_tlt.engine.request import CompletionOutput, Request
from verl_tlt.engine.sampler import params_tensors, sample_tokens
from verl_tlt.engine.sampling_params import LOGPROBS_MODES, SamplingParams
from verl_tlt.engine.speculative import (
    accepted_path_moves,
    draft_sources,
    draft_trees,
    group_draft_trees,
    tree_forward_layout,
)
from verl_tlt.modeling.model import AttentionBatch, CausalLM
from verl_tlt.modeling.weights import load_pretrained, load_weights, read_eos_token_ids
from verl_tlt.policy import PLAIN, DecodeStats, Policy
from verl_tlt.policy.decode_stats import DecodeCosts
from verl_tlt.progress import Progress
from verl_tlt.spec.keyed_noise import gumbel_noise, request_key
from verl_tlt.spec.logits import LogitsParams, token_log_probs
from verl_tlt.spec.strategy import EAGLE, SpecStrategy
from verl_tlt.spec.verify import emitted_positions, verify_keyed, verify_tree

logger = logging.getLogger(__name__)

SAMPLING_MODES = ("keyed", "rejection")


class RolloutEngine:
    """The engine; keyword options besides the obvious ones:

    cpu_layouts, cpu_kernels: serve CPU products from weight copies in faster kernel layouts (None: auto), each layer
        running the kernel measured fastest on this host for its shape and row count ("measure"), or by size
        thresholds ("thresholds"), or one named kernel (see engine.cpu_kernels).
    compile: run the target's forward steps through torch.compile (see compiled_forward): worth it for small,
        overhead-bound models; the first step of each kind compiles (seconds to a minute on a small CPU).
    cuda_graphs: on CUDA, replay decode and verify forwards from CUDA graphs per (width, batch bucket) (see
        cuda_graphs); ignored, with a warning, on other devices.
    sampling: how sampled (temperature > 0) rows draw tokens.
        "keyed" (default): Gumbel-max with noise keyed by (request, token position) (spec.keyed_noise). Plain and
        speculative decoding then emit the same tokens under the same keys, whatever the batch, strategy or
        drafter; a request's key comes from its seed, or else from the engine's seed and the order requests
        arrive in. Drafts are the drafter's own Gumbel-max draws with the same noise (chains; trees are the
        drafter's top-k), and verification accepts a draft exactly when it is the target's draw.
        "rejection": standard speculative sampling (drafts sampled from the drafter, recursive rejection sampling
        against the target): the same distribution, with draws that depend on the steps' strategies.
    group_drafts: model-free drafts from each request's group (engine.group_drafts), for strategies whose source is
        suffix or mixed; made with defaults when such a strategy is first asked for. Requests join a group through
        `add_request(..., group=key)` or `generate(..., groups=[...])`.
    """

    def __init__(
        self,
        model: CausalLM,
        *,
        eos_token_ids: Sequence[int],
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        seed: int = 0,
        logprobs_mode: str = "processed_logprobs",
        drafter: Drafter | None = None,
        max_draft_tokens: int = 64,
        policy: Policy | None = None,
        cpu_layouts: bool | None = None,
        cpu_kernels: str = "measure",
        compile: bool = False,
        cuda_graphs: bool = False,
        sampling: str = "keyed",
        group_drafts: GroupDrafts | None = None,
    ):
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling must be one of {SAMPLING_MODES}, got {sampling!r}")
        self.keyed_sampling = sampling == "keyed"
        self.model = model.eval()
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.kernel_plan = setup_cpu_kernels(model, cpu_layouts, cpu_kernels)
        # torch.compile'd target forwards, one per kind of step (engine.compiled_forward); None runs eagerly.
        self.compiled = CompiledForward(model) if compile else None
        if cuda_graphs and self.device.type != "cuda":
            logger.warning("RolloutEngine(cuda_graphs=True) on %s: CUDA graphs need CUDA; not using them", self.device)
            cuda_graphs = False
        self._wants_graphs = cuda_graphs
        self.graphs: StepGraphPool | None = None  # built by the first decode step, or by enable_step_graphs
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len or model.spec.max_position_embeddings
        self.raw_logprobs = logprobs_mode == "raw_logprobs"
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        if max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens must be >= 1, got {max_draft_tokens}")
        self.max_draft_tokens = max_draft_tokens
        # Draft-tree nodes are verified in scratch positions after a row's prefix, hence the extra room.
        cache_len = self.max_model_len + max_draft_tokens + 1
        self.cache = SlotKVCache(model.spec, dtype=self.dtype, device=self.device, max_len=cache_len)
        self.running: list[Request] = []  # running[i] occupies cache slot i
        self.cache_lens: list[int] = []  # tokens already written to the cache, per running request
        self.waiting: deque[Request] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._aborted: set[str] = set()
        self.drafter: Drafter | None = None
        self.drafter_error: str | None = None  # set when the drafter failed; speculation stays off until reset
        self.set_drafter(drafter)
        # Indexes requests from their admission on; None until group drafts are wanted (it costs Python per token).
        self.group_drafts = group_drafts
        self.group_drafts_error: str | None = None  # set when group drafting failed; it stays off from then on
        # Chooses plain or SD per decode step when generate/step get no explicit strategy (needs a drafter).
        self.policy = policy  # validated by the setter below
        self.stats = DecodeStats()
        self.decode_costs = DecodeCosts()  # by batch-size group and arm, taken by whoever reports them
        self._params_cache: tuple[tuple[int, ...], LogitsParams, list[Request]] | None = None

    @classmethod
    def from_pretrained(
        cls, path: str, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, **kwargs
    ) -> RolloutEngine:
        """Build the engine from a local transformers checkpoint directory (kwargs: see __init__).

        drafter may be a Drafter or the path of an exported EAGLE drafter (`verl-tlt drafter warmup` output), which
        is loaded against this target (shared embedding and LM head).
        """
        model, config = load_pretrained(path, device=device, dtype=dtype)
        kwargs.setdefault("eos_token_ids", read_eos_token_ids(path, config))
        drafter = kwargs.pop("drafter", None)
        engine = cls(model, **kwargs)
        if isinstance(drafter, (str, os.PathLike)):
            from verl_tlt.drafter.load import load_eagle
            from verl_tlt.engine.eagle_drafter import EagleDrafter

            drafter = EagleDrafter(load_eagle(str(drafter), model), max_len=engine.cache.max_len)
        engine.set_drafter(drafter)
        return engine

    def set_drafter(self, drafter: Drafter | None) -> None:
        """Attach (or with None, detach) the draft model used by speculative steps, between generate calls."""
        if self.running or self.waiting:
            raise RuntimeError(
                "Cannot change the drafter while requests are in flight: the new drafter has not seen their context"
            )
        if drafter is not None and drafter.vocab_size != self.model.spec.vocab_size:
            raise ValueError(
                f"Drafter vocabulary ({drafter.vocab_size}) differs from the target's ({self.model.spec.vocab_size}); "
                "the torch engine needs a drafter over the target's vocabulary"
            )
        if self.drafter is not None:
            self.drafter.reset()
        self.drafter, self.drafter_error = drafter, None

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

    def _ensure_group_drafts(self) -> None:
        if self.group_drafts is None:
            if self.running:  # requests admitted before this have no documents: they draft nothing
                logger.warning("Group drafts start with %d requests running; those draft nothing", len(self.running))
            self.group_drafts = GroupDrafts()

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
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        generator = None
        if params.seed is not None and not self.keyed_sampling:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        request = Request(request_id, [int(t) for t in prompt_ids], params, generator, self.max_model_len)
        request.stop_ids = self._stop_ids(params)
        request.group = group
        with self._lock:
            if self.keyed_sampling:  # drawn under the lock: keys follow the order requests arrive in
                seed = params.seed
                if seed is None:
                    seed = int(torch.randint(0, 1 << 62, (1,), generator=self.generator, device=self.device))
                request.noise_key = request_key(seed)
            self.waiting.append(request)
        return request_id

    def _check_prompt(self, prompt_ids: Sequence[int]) -> None:
        if len(prompt_ids) == 0:
            raise ValueError("prompt_ids must not be empty")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"Prompt of {len(prompt_ids)} tokens leaves no room to generate within max_model_len="
                f"{self.max_model_len}"
            )
        vocab_size = self.model.spec.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab_size:  # would fail the whole batch's prefill
            bad = [int(t) for t in prompt_ids if not 0 <= int(t) < vocab_size]
            raise ValueError(f"Prompt token ids {bad[:5]} are outside the model's vocabulary [0, {vocab_size})")

    def abort(self, request_id: str) -> None:
        """Finish a request early with finish_reason 'abort' at the next step."""
        with self._lock:
            self._aborted.add(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # ----- stepping ----------------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, strategy: SpecStrategy | str | None = None) -> list[CompletionOutput]:
        """Run one prefill or decode step; return the requests that finished in it.

        strategy: decode this step speculatively with the drafter (a SpecStrategy or 'depth_topk_treetokens').
        None decodes plainly, or, when an adaptive policy is attached, lets the policy choose. Prefill steps
        ignore it. Any step may switch, for any batch.
        """
        spec = self._check_strategy(strategy)
        finished = self._collect_aborted()
        admitted = self._admit()
        if admitted:
            self._prefill(admitted)
        elif self.running:
            self._decode_step(spec)
        return finished + self._retire_finished()

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
        spec = self._check_strategy(strategy)
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
            for output in self.step(spec):
                done[output.request_id] = output
            if progress is not None:
                progress.update(len(done))
        return [done[i] for i in ids]

    # ----- weights -----------------------------------------------------------------------------------------

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load updated weights (transformers names) between steps; returns how many tensors were loaded."""
        return load_weights(self.model, named_tensors, strict=False)

    def reset(self) -> None:
        """Drop every request (waiting and running) without outputs; used after an unrecoverable step error."""
        with self._lock:
            self.waiting.clear()
            self._aborted.clear()
        self.running, self.cache_lens = [], []
        if self.drafter is not None:
            self.drafter.reset()
        if self.group_drafts is not None:
            self.group_drafts.reset()

    def release_cache(self) -> None:
        if self.running or self.waiting:
            raise RuntimeError("Cannot release the KV cache while requests are in flight")
        if self.graphs is not None:
            self.graphs.reset()  # they point into the cache
        self.cache.release()
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
        self.graphs = StepGraphPool(
            self.model,
            self.cache,
            self.model.spec.head_dim,
            self.dtype,
            batch_buckets=graph_batch_buckets(self.max_num_seqs),
            widths=widths,
            verify_max_batch=verify_max_batch,
            min_slots=self.max_num_seqs,
            capture=capture,
        )
        self._wants_graphs = True
        return self.graphs

    # ----- internals ---------------------------------------------------------------------------------------

    def _admit(self) -> list[Request]:
        admitted = []
        with self._lock:
            while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
                admitted.append(self.waiting.popleft())
        return admitted

    def _prefill(self, requests: list[Request]) -> None:
        row_start = len(self.running)
        lengths = [len(r.prompt_ids) for r in requests]
        seq = max(lengths)
        self.cache.ensure_capacity(row_start + len(requests), seq + 1)
        input_ids = torch.zeros(len(requests), seq, dtype=torch.long, device=self.device)
        for row, request in enumerate(requests):
            input_ids[row, : lengths[row]] = torch.tensor(request.prompt_ids, device=self.device)
        positions = torch.arange(seq, device=self.device).expand(len(requests), seq)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=self.device).tril()
        mask = causal.expand(len(requests), 1, seq, seq)
        hidden = self._forward("prefill", input_ids, positions, row_start, positions, mask)  # [N, T, H]
        last = torch.tensor(lengths, device=self.device) - 1
        logits = self.model.logits(hidden[torch.arange(len(requests)), last])  # [N, V]
        if self._records_hidden:
            for row, request in enumerate(requests):
                request.pending_hidden.append(hidden[row, : lengths[row]].clone())
        self.running.extend(requests)
        self.cache_lens.extend(lengths)
        self._emit(requests, logits)
        if self.group_drafts is not None:
            self.group_drafts.admit(requests)

    def _decode(self) -> None:
        lens = torch.tensor(self.cache_lens, device=self.device)  # [B]
        self.cache.ensure_capacity(len(self.running), max(self.cache_lens) + 1)
        input_ids = torch.tensor([[r.output_ids[-1]] for r in self.running], device=self.device)
        positions = lens.unsqueeze(-1)  # [B, 1]
        kv_len = int(lens.max()) + 1
        mask = (torch.arange(kv_len, device=self.device) <= positions).view(len(self.running), 1, 1, kv_len)
        hidden = self._forward("decode", input_ids, positions, 0, positions, mask)
        logits = self.model.logits(hidden[:, -1])
        self.cache_lens = [n + 1 for n in self.cache_lens]
        for row, request in enumerate(self.running):
            request.num_decode_steps += 1
            if self._records_hidden:
                request.pending_hidden.append(hidden[row, -1:].clone())
        self._emit(self.running, logits)

    def _decode_step(self, forced: SpecStrategy | None) -> None:
        """One decode step, plain or speculative; the adaptive policy (if any) chooses and learns."""
        batch_size = len(self.running)
        can_speculate = self._can_draft_with_drafter or self._can_draft_from_groups
        asks_policy = forced is None and self.policy is not None and can_speculate
        strategy = self.policy.select(batch_size) if asks_policy else forced
        if strategy is not None and not self._can_draft(strategy):
            strategy = None  # its source failed earlier: plain decoding (the policy learns the plain step's rate)
        before = sum(len(r.output_ids) for r in self.running)
        start = time.perf_counter()
        if strategy is not None and not self._decode_speculative(strategy):
            strategy = None  # the drafter failed: this step (and the following ones) decode plainly
        if strategy is None:
            self._decode()
        seconds = time.perf_counter() - start
        committed = sum(len(r.output_ids) for r in self.running) - before
        if asks_policy:
            self.policy.observe(strategy, batch_size, committed, seconds)
        self.stats.record(strategy, batch_size, committed, seconds, self.policy)
        self.decode_costs.record(PLAIN if strategy is None else strategy.name, batch_size, committed, seconds)

    def _decode_speculative(self, strategy: SpecStrategy) -> bool:
        """Draft a tree per running row, verify all nodes in one target forward, commit what is accepted.

        Returns False, having changed nothing in the target's state, if the drafter fails: a broken drafter turns
        speculation off (until `set_drafter`) instead of failing the requests.
        """
        requests = self.running
        params = self._logits_params(requests)
        noise = self._keyed_noise(requests, params, strategy.depth + 1, self.model.spec.vocab_size)
        try:
            if strategy.source == EAGLE:
                tree = draft_trees(self.drafter, requests, strategy, params, self.generator, self.device, noise)
                group_levels = None
            else:
                tree, group_levels = group_draft_trees(
                    self.group_drafts, self.drafter, requests, strategy, params, self.generator, self.device, noise
                )
        except Exception as error:
            self._disable_source(strategy, error)
            return False
        if tree is None:  # no row's group had a match: nothing to verify, a plain step (judged as the strategy's)
            self._decode()
            return True
        lens = torch.tensor(self.cache_lens, device=self.device)
        self.cache.ensure_capacity(len(requests), max(self.cache_lens) + tree.num_nodes)
        positions, write_pos, mask = tree_forward_layout(tree, lens)
        hidden = self._forward("verify", tree.tokens, positions, 0, write_pos, mask)  # [B, N+1, H]
        logits = self.model.logits(hidden)  # [B, N+1, V]
        processed = params.process(logits)
        if noise is None:
            generators = [r.generator for r in requests]
            results = verify_tree(tree, processed, params.is_greedy, generators, self.generator)
        else:
            results = verify_keyed(tree, processed, noise)
        moves = accepted_path_moves(results, self.cache_lens, self.device)
        if moves is not None:
            self.cache.compact_rows(*moves)
        rows, nodes, tokens = emitted_positions(results, logits.device)
        source = logits if self.raw_logprobs else processed
        log_probs = token_log_probs(source[rows, nodes], tokens).tolist()
        self.stats.record_sources(*draft_sources(strategy, tree, results, group_levels))
        offset = 0
        for row, (request, result) in enumerate(zip(requests, results, strict=True)):
            self._commit(request, result.tokens, log_probs[offset : offset + len(result.tokens)])
            offset += len(result.tokens)
            self.cache_lens[row] += len(result.path)
            request.num_decode_steps += 1
            request.num_verify_steps += 1
            request.num_draft_tokens += tree.num_nodes - 1
            request.num_accepted_tokens += result.num_accepted
            if self._records_hidden:
                request.pending_hidden.append(hidden[row, result.path])
        return True

    def _disable_source(self, strategy: SpecStrategy, error: Exception) -> None:
        """A draft source failed: it stays off (the drafter until `set_drafter`, group drafts for good) and the step
        decodes plainly. A mixed step's failure is the drafter's unless the group drafts raised it."""
        if strategy.uses_drafter and not isinstance(error, GroupDraftError):
            logger.exception("Drafter failed; this engine decodes plainly until a drafter is set again")
            self._disable_drafter(error)
        else:
            logger.exception("Group drafts failed; this engine drafts from groups no more")
            self.group_drafts_error = f"{type(error).__name__}: {error}"
            self.stats.drafter_failures += 1

    @property
    def _can_draft_with_drafter(self) -> bool:
        return self.drafter is not None and self.drafter_error is None

    @property
    def _can_draft_from_groups(self) -> bool:
        return self.group_drafts is not None and self.group_drafts_error is None

    def _can_draft(self, strategy: SpecStrategy) -> bool:
        if strategy.source == EAGLE:
            return self._can_draft_with_drafter
        if strategy.uses_drafter:  # mixed
            return self._can_draft_with_drafter and self._can_draft_from_groups
        return self._can_draft_from_groups

    def _disable_drafter(self, error: Exception) -> None:
        self.drafter_error = f"{type(error).__name__}: {error}"
        self.stats.drafter_failures += 1
        for request in self.running:  # whatever the drafter had consumed is gone with it
            request.num_drafter_synced, request.pending_hidden = 0, []

    def _commit(self, request: Request, tokens: list[int], log_probs: list[float]) -> None:
        """Append tokens until the request finishes (EOS/stop/max inside a draft: nothing after it is kept)."""
        for token, log_prob in zip(tokens, log_probs, strict=True):
            if request.finish_reason is not None:
                return
            request.append(token, log_prob, request.stop_ids)

    def _check_strategy(self, strategy: SpecStrategy | str | None, needs_drafter: bool = True) -> SpecStrategy | None:
        if strategy is None:
            return None
        spec = SpecStrategy.parse(strategy)
        if spec.uses_group_drafts:
            self._ensure_group_drafts()
        if needs_drafter and spec.uses_drafter and self.drafter is None:
            raise ValueError(
                f"Speculative strategy {spec.name!r} needs a drafter: pass drafter=... to RolloutEngine(...) or "
                "RolloutEngine.from_pretrained(...), or call engine.set_drafter(...)"
            )
        if spec.tree_tokens > self.max_draft_tokens:
            raise ValueError(
                f"Speculative strategy {spec.name!r} verifies {spec.tree_tokens} draft tokens but the KV cache "
                f"reserves room for max_draft_tokens={self.max_draft_tokens}; build the engine with "
                f"max_draft_tokens>={spec.tree_tokens} or use a smaller strategy"
            )
        if spec.top_k > self.model.spec.vocab_size:
            raise ValueError(
                f"Speculative strategy {spec.name!r}: top_k exceeds the vocabulary ({self.model.spec.vocab_size})"
            )
        return spec

    @property
    def _records_hidden(self) -> bool:
        return self.drafter is not None and self.drafter_error is None and self.drafter.uses_hidden_states

    def _forward(self, kind: str, input_ids, positions, row_start, write_pos, mask) -> torch.Tensor:
        cos, sin = self.model.rotary_tables(positions, self.dtype, max_position=mask.shape[-1])
        batch = AttentionBatch(row_start=row_start, write_pos=write_pos, attn_mask=mask, cos=cos, sin=sin)
        if kind != "prefill" and row_start == 0 and self._wants_graphs:
            graphs = self.graphs or self.enable_step_graphs()
            if graphs.serves(input_ids.shape[1], input_ids.shape[0]):
                return graphs.run(input_ids, positions, write_pos, mask, cos, sin)
        if self.compiled is not None:
            return self.compiled(kind, input_ids, positions, batch, self.cache.k, self.cache.v)
        return self.model(input_ids, positions, batch, self.cache.k, self.cache.v)

    def _emit(self, requests: list[Request], logits: torch.Tensor) -> None:
        params = self._logits_params(requests)
        noise = self._keyed_noise(requests, params, 1, logits.shape[-1])
        tokens, log_probs = sample_tokens(
            logits,
            requests,
            params,
            self.generator,
            raw_logprobs=self.raw_logprobs,
            noise=None if noise is None else noise[:, 0],
        )
        for request, token, log_prob in zip(requests, tokens, log_probs, strict=True):
            if request.finish_reason is None:  # an aborted row waits for retirement without growing (as _commit)
                request.append(token, log_prob, request.stop_ids)

    def _keyed_noise(
        self, requests: list[Request], params: LogitsParams, width: int, vocab_size: int
    ) -> torch.Tensor | None:
        """[B, width, V] keyed Gumbel noise for the next `width` token positions of every row (zero on greedy rows),
        or None when sampling is not keyed or every row is greedy."""
        greedy = params.greedy_rows
        if not self.keyed_sampling or all(greedy):
            return None
        keys = np.array([r.noise_key for r in requests], dtype=np.uint64)
        positions = np.array([r.num_tokens for r in requests], dtype=np.int64)[:, None] + np.arange(width)
        noise = gumbel_noise(keys, positions, vocab_size, self.device)
        if any(greedy):
            noise.masked_fill_(params.is_greedy.view(-1, 1, 1), 0.0)
        return noise

    def _logits_params(self, requests: list[Request]) -> LogitsParams:
        """Sampling parameters of `requests` as tensors, rebuilt only when the batch composition changes."""
        # Keyed by object identity; the cache keeps the requests alive, so their ids cannot be reused meanwhile.
        key = tuple(map(id, requests))
        if self._params_cache is None or self._params_cache[0] != key:
            self._params_cache = (key, LogitsParams(*params_tensors(requests, self.device)), list(requests))
        return self._params_cache[1]

    def _stop_ids(self, params: SamplingParams) -> frozenset[int]:
        stop_ids = params.stop_token_ids
        return frozenset(stop_ids) if params.ignore_eos else self.eos_token_ids.union(stop_ids)

    def _collect_aborted(self) -> list[CompletionOutput]:
        with self._lock:
            aborted, self._aborted = self._aborted, set()
            if not aborted:
                return []
            dropped = [r for r in self.waiting if r.request_id in aborted]
            self.waiting = deque(r for r in self.waiting if r.request_id not in aborted)
        for request in self.running:
            if request.request_id in aborted and request.finish_reason is None:
                request.finish_reason = "abort"
        for request in dropped:
            request.finish_reason = "abort"
        return [r.to_output() for r in dropped]

    def _retire_finished(self) -> list[CompletionOutput]:
        """Remove finished requests from the running batch, keeping slots compact."""
        outputs = []
        row = 0
        while row < len(self.running):
            request = self.running[row]
            if request.finish_reason is None:
                row += 1
                continue
            outputs.append(request.to_output())
            if self.group_drafts is not None:
                self.group_drafts.retire(request)
            last = len(self.running) - 1
            if row != last:
                self.cache.move_slot(last, row, self.cache_lens[last])
                if self.drafter is not None:
                    self.drafter.move_slot(last, row)
                self.running[row], self.cache_lens[row] = self.running[last], self.cache_lens[last]
            self.running.pop()
            self.cache_lens.pop()
        return outputs
