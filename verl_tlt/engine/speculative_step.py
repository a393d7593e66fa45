"""One speculative decode step, draft -> verify -> commit, and the health of the draft sources it uses.

`SpeculativeStep.run` drafts a tree (or chain) per running row from the strategy's source (the drafter, the
requests' groups, or both: `draft_trees`, `group_draft_trees`), has the model runner verify every node in one target
forward (the runner lays the nodes out after each row's cache), picks what each row accepts (`spec.verify`), moves
the accepted path's KV entries next to the row's prefix (`accepted_path_moves`) and commits the tokens. It returns
what it actually ran: a `StepOutcome` saying whether it speculated, which arm the step's time counts for, and why it
did not speculate when it did not.

A draft source that raises is turned off (the drafter until the engine gets a new one, group drafts for good) and
the step reports that it changed nothing, so the engine decodes that step plainly: a broken drafter costs speed,
never a request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from verl_tlt.engine.drafts.base import DraftContext, Drafter
from verl_tlt.engine.drafts.group import GroupDraftError, GroupDrafts
from verl_tlt.engine.model_runner import ModelRunner
from verl_tlt.engine.request import Request
from verl_tlt.engine.sampler import BatchSampler
from verl_tlt.engine.scheduler import Scheduler
from verl_tlt.policy import DecodeStats
from verl_tlt.spec.logits import LogitsParams, token_log_probs
from verl_tlt.spec.strategy import EAGLE, MIXED, SUFFIX, SpecStrategy
from verl_tlt.spec.suffix_trees import chain_from_proposals, proposal_chain_tokens, tree_from_proposals
from verl_tlt.spec.tree import DraftTree, build_chain, build_eagle2_tree
from verl_tlt.spec.verify import VerifyResult, emitted_positions, verify_keyed, verify_tree

logger = logging.getLogger(__name__)

# Why a step was not speculative (StepOutcome.why_plain).
NO_STRATEGY = "no strategy"  # plain decoding was asked for (or the policy chose it)
SOURCE_OFF = "source off"  # the strategy's draft source failed in an earlier step
SOURCE_FAILED = "source failed"  # the strategy's draft source raised in this step (now off)
NO_DRAFT = "no draft"  # no row had a draft (no group matched): a plain step the strategy chose


@dataclass(frozen=True)
class StepOutcome:
    """What `SpeculativeStep.run` did.

    speculated: drafts were verified and tokens committed; otherwise nothing changed and the caller decodes plainly.
    arm: the strategy the step's time and tokens count for (the adaptive policy's arm), None for plain: the
    strategy when it speculated or when no row had a draft, None when it was not asked for or its source failed.
    why_plain: None when it speculated, else one of NO_STRATEGY, SOURCE_OFF, SOURCE_FAILED, NO_DRAFT.
    """

    speculated: bool
    arm: SpecStrategy | None
    why_plain: str | None = None


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

    def run(self, strategy: SpecStrategy | None, scheduler: Scheduler, stats: DecodeStats) -> StepOutcome:
        """Draft a tree per running row, verify all nodes in one target forward, commit what is accepted.

        Changes nothing in the target's state unless it speculated (see StepOutcome); the caller then decodes
        plainly.
        """
        if strategy is None:
            return StepOutcome(False, None, NO_STRATEGY)
        if not self.can_draft(strategy):
            return StepOutcome(False, None, SOURCE_OFF)
        requests = scheduler.running
        params = self.sampler.params(requests)
        noise = self.sampler.noise(requests, params, strategy.depth + 1, self.runner.model.spec.vocab_size)
        step = DraftInputs(requests, strategy, params, self.sampler.generator, self.runner.device, noise)
        try:
            if strategy.source == EAGLE:
                tree, group_levels = draft_trees(self.drafter, step), None
            else:
                tree, group_levels = group_draft_trees(self.group_drafts, self.drafter, step)
        except Exception as error:
            self._disable_source(strategy, error, requests, stats)
            return StepOutcome(False, None, SOURCE_FAILED)
        if tree is None:
            return StepOutcome(False, strategy, NO_DRAFT)
        self._verify_and_commit(strategy, tree, group_levels, scheduler, params, noise, stats)
        return StepOutcome(True, strategy)

    def _verify_and_commit(
        self,
        strategy: SpecStrategy,
        tree: DraftTree,
        group_levels: list[int] | None,
        scheduler: Scheduler,
        params: LogitsParams,
        noise: torch.Tensor | None,
        stats: DecodeStats,
    ) -> None:
        requests, cache_lens = scheduler.running, scheduler.cache_lens
        hidden = self.runner.verify(tree, cache_lens)  # [B, N+1, H]
        logits = self.runner.logits(hidden)  # [B, N+1, V]
        processed = params.process(logits)
        if noise is None:
            generators = [r.generator for r in requests]
            results = verify_tree(tree, processed, params.is_greedy, generators, self.sampler.generator)
        else:
            results = verify_keyed(tree, processed, noise)
        moves = accepted_path_moves(results, cache_lens, self.runner.device)
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


# ----- draft: trees from the drafter and from the requests' groups -------------------------------------------


@dataclass(frozen=True)
class DraftInputs:
    """What every draft source reads in one step.

    noise: keyed Gumbel noise [B, depth + 1, V] of the rows' next positions (keyed sampling), or None (rejection
    sampling: rows draw from their generators, or the engine's `generator`)."""

    requests: list[Request]
    strategy: SpecStrategy
    params: LogitsParams
    generator: torch.Generator
    device: torch.device
    noise: torch.Tensor | None


def draft_trees(drafter: Drafter, step: DraftInputs, forced: torch.Tensor | None = None) -> DraftTree:
    """Sync the drafter with every running row and build one draft tree per row.

    forced: [B, depth] tokens that replace the drafter's at chain levels where >= 0 (mixed drafts; see build_chain).

    With keyed noise a chain drafts position d as argmax(processed draft logits + noise[:, d]), the draw the target
    makes there if the drafter matches it. Trees are the drafter's top-k either way."""
    requests, strategy = step.requests, step.strategy
    contexts = []
    for request in requests:
        hidden = torch.cat(request.pending_hidden) if request.pending_hidden else None
        contexts.append(DraftContext(request.all_token_ids, request.num_drafter_synced, hidden))
        request.num_drafter_synced, request.pending_hidden = request.num_tokens - 1, []
    root_logits = drafter.begin(contexts)
    root_tokens = torch.tensor([r.last_token_id for r in requests], device=step.device)
    if strategy.is_chain:
        generators = [r.generator for r in requests]
        return build_chain(
            root_tokens,
            root_logits,
            drafter.extend_chain,
            step.params,
            strategy.depth,
            generators,
            step.generator,
            noise=step.noise,
            forced=forced,
        )
    return build_eagle2_tree(root_tokens, root_logits, drafter.expand, step.params, strategy)


def group_draft_trees(
    group_drafts: GroupDrafts, drafter: Drafter | None, step: DraftInputs
) -> tuple[DraftTree | None, list[int] | None]:
    """Draft trees of a SUFFIX or MIXED strategy, and how many leading levels of each row the group's text drafted.

    suffix: the group drafts only (a chain as deep as the longest proposal, or a padded tree); (None, None) when no
    row has one. mixed (chains): rows whose group has a match take its tokens, and the drafter drafts every other
    level (rows without a match, and the levels after a short match); the drafter is not run at all when every row's
    match fills the chain. The level counts are None for trees, where every proposed node is a group draft.
    """
    requests, strategy = step.requests, step.strategy
    proposals = group_drafts.propose(requests, strategy)
    root_tokens = torch.tensor([r.last_token_id for r in requests], device=step.device)
    if strategy.source == SUFFIX and not strategy.is_chain:
        return tree_from_proposals(root_tokens, proposals), None
    chains = proposal_chain_tokens(proposals, strategy.depth)
    levels = [len(chain) for chain in chains]
    if strategy.source == SUFFIX or min(levels) == strategy.depth:
        return chain_from_proposals(root_tokens, chains), levels
    if strategy.source != MIXED or drafter is None:
        raise ValueError(f"Strategy {strategy.name!r} needs a drafter for the rows its group drafts do not fill")
    forced = torch.full((len(requests), strategy.depth), -1, dtype=torch.long)
    for row, chain in enumerate(chains):
        forced[row, : len(chain)] = torch.tensor(chain, dtype=torch.long)
    return draft_trees(drafter, step, forced.to(step.device)), levels


# ----- commit: where the accepted path's KV entries go, and what each source drafted ---------------------------


def accepted_path_moves(
    results: list[VerifyResult], cache_lens: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(rows, src, dst) cache positions that bring each accepted path next to its prefix; None if none move.

    The j-th accepted node was written at cache_len + node and belongs at cache_len + j (node >= j always).
    """
    rows, src, dst = [], [], []
    for row, result in enumerate(results):
        for depth, node in enumerate(result.path):
            if node != depth:
                rows.append(row)
                src.append(cache_lens[row] + node)
                dst.append(cache_lens[row] + depth)
    if not rows:
        return None
    return tuple(torch.tensor(values, device=device) for values in (rows, src, dst))


def draft_sources(
    strategy: SpecStrategy, tree: DraftTree, results: list[VerifyResult], group_levels: list[int] | None
) -> tuple[dict[str, int], dict[str, int]]:
    """Draft tokens verified and accepted per source ('eagle', 'suffix') in one step, for the per-source metrics.

    group_levels: leading chain levels per row drafted from the group (group_draft_trees); None for the drafter's own
    trees (every node its) and for suffix trees (every node the group's). Padding of short suffix drafts is not
    counted as drafted (an accepted padding token is counted as accepted: it was verified and kept like a draft).
    """
    drafted: dict[str, int] = {}
    accepted: dict[str, int] = {}

    def add(source: str, num_drafted: int, num_accepted: int) -> None:
        drafted[source] = drafted.get(source, 0) + num_drafted
        accepted[source] = accepted.get(source, 0) + num_accepted

    num_nodes = tree.num_nodes - 1
    for row, result in enumerate(results):
        if strategy.source == EAGLE:
            add(EAGLE, num_nodes, result.num_accepted)
        elif group_levels is None:  # a suffix tree
            add(SUFFIX, num_nodes, result.num_accepted)
        else:
            from_group = group_levels[row]
            add(
                SUFFIX,
                from_group,
                min(result.num_accepted, from_group) if strategy.source == MIXED else result.num_accepted,
            )
            if strategy.source == MIXED:
                add(EAGLE, num_nodes - from_group, max(result.num_accepted - from_group, 0))
    return drafted, accepted
