"""The pieces of one speculative decode step: draft, lay the tree out in the KV cache, commit the verdict.

The engine's `_decode_speculative` strings them together: the drafter proposes a tree per running row
(`draft_trees`), the target verifies every node in one forward (`tree_forward_layout` places the nodes after
each row's cache), `verify_tree` picks what is accepted, and `accepted_path_moves` says which KV entries must
move so that the accepted path sits contiguously after the row's committed prefix.
"""

from __future__ import annotations

import torch

from verl_tlt.engine.drafter import DraftContext, Drafter
from verl_tlt.engine.request import Request
from verl_tlt.spec.logits import LogitsParams
from verl_tlt.spec.strategy import SpecStrategy
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
) -> DraftTree:
    """Sync the drafter with every running row and build one draft tree per row.

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
