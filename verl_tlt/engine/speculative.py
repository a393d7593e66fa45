"""The pieces of one speculative decode step: draft, lay the tree out in the KV cache, commit the verdict.

The engine's `_decode_speculative` strings them together: the drafter proposes a tree per running row
(`draft_trees`), the target verifies every node in one forward (`tree_forward_layout` places the nodes after
each row's cache), `verify_tree` picks what is accepted, and `accepted_path_moves` says which KV entries must
move so that the accepted path sits contiguously after the row's committed prefix.
"""

from __future__ import annotations

import torch

from verl_tlt.engine.drafter import DraftContext, Drafter
from verl_tlt.engine.group_drafts import GroupDrafts
from verl_tlt.engine.request import Request
from verl_tlt.spec.logits import LogitsParams
from verl_tlt.spec.strategy import EAGLE, MIXED, SUFFIX, SpecStrategy
from verl_tlt.spec.suffix_trees import chain_from_proposals, proposal_chain_tokens, tree_from_proposals
from verl_tlt.spec.tree import DraftTree, build_chain, build_eagle2_tree, tree_attention_mask
from verl_tlt.spec.verify import VerifyResult


def draft_trees(
    drafter: Drafter,
    requests: list[Request],
    strategy: SpecStrategy,
    params: LogitsParams,
    default_generator: torch.Generator,
    device: torch.device,
    noise: torch.Tensor | None = None,
    forced: torch.Tensor | None = None,
) -> DraftTree:
    """Sync the drafter with every running row and build one draft tree per row.

    forced: [B, depth] tokens that replace the drafter's at chain levels where >= 0 (mixed drafts; see build_chain).

    noise: keyed Gumbel noise [B, depth + 1, V] of the row's next positions (keyed sampling), or None; a chain
    then drafts position d as argmax(processed draft logits + noise[:, d]), the draw the target makes there if the
    drafter matches it. Trees are the drafter's top-k either way."""
    contexts = []
    for request in requests:
        hidden = torch.cat(request.pending_hidden) if request.pending_hidden else None
        contexts.append(DraftContext(request.all_token_ids, request.num_drafter_synced, hidden))
        request.num_drafter_synced, request.pending_hidden = request.num_tokens - 1, []
    root_logits = drafter.begin(contexts)
    root_tokens = torch.tensor([r.last_token_id for r in requests], device=device)
    if strategy.is_chain:
        generators = [r.generator for r in requests]
        return build_chain(
            root_tokens,
            root_logits,
            drafter.extend_chain,
            params,
            strategy.depth,
            generators,
            default_generator,
            noise=noise,
            forced=forced,
        )
    return build_eagle2_tree(root_tokens, root_logits, drafter.expand, params, strategy)


def tree_forward_layout(tree: DraftTree, cache_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positions, cache write positions and attention mask for verifying `tree` in one target forward.

    Node i of row b is written at cache position cache_lens[b] + i (scratch beyond the committed prefix) and
    attends to the committed prefix plus its own ancestors. Returns positions [B, N+1] (cache_lens + depth),
    write_pos [B, N+1] and mask [B, 1, N+1, L] with L = max(cache_lens) + N + 1.
    """
    rows, num_nodes = tree.tokens.shape
    device = tree.tokens.device
    kv_len = int(cache_lens.max()) + num_nodes
    write_pos = cache_lens.unsqueeze(1) + torch.arange(num_nodes, device=device)  # [B, N+1]
    if tree.is_chain:  # a chain's nodes are its own ancestors in order: the mask is causal
        mask = torch.arange(kv_len, device=device).view(1, 1, kv_len) <= write_pos.unsqueeze(-1)
        return write_pos, write_pos, mask.unsqueeze(1)
    prefix = torch.arange(kv_len, device=device).unsqueeze(0) < cache_lens.unsqueeze(1)  # [B, L]
    mask = prefix.unsqueeze(1).expand(rows, num_nodes, kv_len).clone()
    mask.scatter_(2, write_pos.unsqueeze(1).expand(rows, num_nodes, num_nodes), tree_attention_mask(tree.parents))
    return cache_lens.unsqueeze(1) + tree.depths, write_pos, mask.unsqueeze(1)


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


def group_draft_trees(
    group_drafts: GroupDrafts,
    drafter: Drafter | None,
    requests: list[Request],
    strategy: SpecStrategy,
    params: LogitsParams,
    default_generator: torch.Generator,
    device: torch.device,
    noise: torch.Tensor | None = None,
) -> tuple[DraftTree | None, list[int] | None]:
    """Draft trees of a SUFFIX or MIXED strategy, and how many leading levels of each row the group's text drafted.

    suffix: the group drafts only (a chain as deep as the longest proposal, or a padded tree); (None, None) when no
    row has one. mixed (chains): rows whose group has a match take its tokens, and the drafter drafts every other
    level (rows without a match, and the levels after a short match); the drafter is not run at all when every row's
    match fills the chain. The level counts are None for trees, where every proposed node is a group draft.
    """
    proposals = group_drafts.propose(requests, strategy)
    root_tokens = torch.tensor([r.last_token_id for r in requests], device=device)
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
    tree = draft_trees(drafter, requests, strategy, params, default_generator, device, noise, forced.to(device))
    return tree, levels


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
