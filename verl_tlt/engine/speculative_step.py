"""One speculative decode step (draft, verify, commit) and the health of the draft sources it uses.

Draft sources are the drafter (EAGLE) and the requests' groups (suffix drafts). A source that raises is turned off
(the drafter until the engine gets a new one, group drafts for good) and the step reports that it changed nothing,
so the engine decodes that step plainly: a broken drafter costs speed, never a request.
"""

from __future__ import annotations

import logging

from verl_tlt.engine.drafter import Drafter
from verl_tlt.engine.group_drafts import GroupDraftError, GroupDrafts
from verl_tlt.engine.model_runner import ModelRunner
from verl_tlt.engine.request import Request
from verl_tlt.engine.sampler import BatchSampler
from verl_tlt.engine.scheduler import Scheduler
from verl_tlt.engine.speculative import accepted_path_moves, draft_sources, draft_trees, group_draft_trees
from verl_tlt.policy import DecodeStats
from verl_tlt.spec.logits import token_log_probs
from verl_tlt.spec.strategy import EAGLE, SpecStrategy
from verl_tlt.spec.verify import emitted_positions, verify_keyed, verify_tree

logger = logging.getLogger(__name__)


class SpeculativeStep:
    def __init__(self, runner: ModelRunner, sampler: BatchSampler, group_drafts: GroupDrafts | None):
        self.runner, self.sampler = runner, sampler
        self.drafter: Drafter | None = None
        self.drafter_error: str | None = None  # set when the drafter failed; it stays off until a new one is set
        # Indexes requests from their admission on; None until group drafts are wanted (it costs Python per token).
        self.group_drafts = group_drafts
        self.group_drafts_error: str | None = None  # set when group drafting failed; it stays off from then on

    def set_drafter(self, drafter: Drafter | None) -> None:
        if self.drafter is not None:
            self.drafter.reset()
        self.drafter, self.drafter_error = drafter, None

    def ensure_group_drafts(self, num_running: int) -> None:
        if self.group_drafts is None:
            if num_running:  # requests admitted before this have no documents: they draft nothing
                logger.warning("Group drafts start with %d requests running; those draft nothing", num_running)
            self.group_drafts = GroupDrafts()

    @property
    def drafter_ok(self) -> bool:
        return self.drafter is not None and self.drafter_error is None

    @property
    def group_drafts_ok(self) -> bool:
        return self.group_drafts is not None and self.group_drafts_error is None

    @property
    def can_speculate(self) -> bool:
        return self.drafter_ok or self.group_drafts_ok

    @property
    def records_hidden(self) -> bool:
        """Whether the target's hidden states must be kept for the drafter (EAGLE drafters read them)."""
        return self.drafter_ok and self.drafter.uses_hidden_states

    def can_draft(self, strategy: SpecStrategy) -> bool:
        if strategy.source == EAGLE:
            return self.drafter_ok
        if strategy.uses_drafter:  # mixed
            return self.drafter_ok and self.group_drafts_ok
        return self.group_drafts_ok

    def run(self, strategy: SpecStrategy, scheduler: Scheduler, stats: DecodeStats) -> bool:
        """Draft a tree per running row, verify all nodes in one target forward, commit what is accepted.

        Returns False, having changed nothing in the target's state, when no row has a draft (no group matched) or
        a draft source failed (then `can_draft(strategy)` is False from now on); the caller decodes plainly.
        """
        requests, cache_lens = scheduler.running, scheduler.cache_lens
        params = self.sampler.params(requests)
        vocab_size = self.runner.model.spec.vocab_size
        noise = self.sampler.noise(requests, params, strategy.depth + 1, vocab_size)
        generator, device = self.sampler.generator, self.runner.device
        try:
            if strategy.source == EAGLE:
                tree = draft_trees(self.drafter, requests, strategy, params, generator, device, noise)
                group_levels = None
            else:
                tree, group_levels = group_draft_trees(
                    self.group_drafts, self.drafter, requests, strategy, params, generator, device, noise
                )
        except Exception as error:
            self._disable_source(strategy, error, requests, stats)
            return False
        if tree is None:
            return False
        hidden = self.runner.verify(tree, cache_lens)  # [B, N+1, H]
        logits = self.runner.logits(hidden)  # [B, N+1, V]
        processed = params.process(logits)
        if noise is None:
            generators = [r.generator for r in requests]
            results = verify_tree(tree, processed, params.is_greedy, generators, generator)
        else:
            results = verify_keyed(tree, processed, noise)
        moves = accepted_path_moves(results, cache_lens, device)
        if moves is not None:
            self.runner.cache.compact_rows(*moves)
        rows, nodes, tokens = emitted_positions(results, logits.device)
        source = logits if self.sampler.raw_logprobs else processed
        log_probs = token_log_probs(source[rows, nodes], tokens).tolist()
        stats.record_sources(*draft_sources(strategy, tree, results, group_levels))
        records_hidden = self.records_hidden
        offset = 0
        for row, (request, result) in enumerate(zip(requests, results, strict=True)):
            _commit(request, result.tokens, log_probs[offset : offset + len(result.tokens)])
            offset += len(result.tokens)
            cache_lens[row] += len(result.path)
            request.num_decode_steps += 1
            request.num_verify_steps += 1
            request.num_draft_tokens += tree.num_nodes - 1
            request.num_accepted_tokens += result.num_accepted
            if records_hidden:
                request.pending_hidden.append(hidden[row, result.path])
        return True

    def _disable_source(
        self, strategy: SpecStrategy, error: Exception, running: list[Request], stats: DecodeStats
    ) -> None:
        """A mixed step's failure is the drafter's unless the group drafts raised it."""
        stats.drafter_failures += 1
        if strategy.uses_drafter and not isinstance(error, GroupDraftError):
            logger.exception("Drafter failed; this engine decodes plainly until a drafter is set again")
            self.drafter_error = f"{type(error).__name__}: {error}"
            for request in running:  # whatever the drafter had consumed is gone with it
                request.num_drafter_synced, request.pending_hidden = 0, []
        else:
            logger.exception("Group drafts failed; this engine drafts from groups no more")
            self.group_drafts_error = f"{type(error).__name__}: {error}"


def _commit(request: Request, tokens: list[int], log_probs: list[float]) -> None:
    """Append tokens until the request finishes (EOS/stop/max inside a draft: nothing after it is kept)."""
    for token, log_prob in zip(tokens, log_probs, strict=True):
        if request.finish_reason is not None:
            return
        request.append(token, log_prob, request.stop_ids)
