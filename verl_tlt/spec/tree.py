"""Draft trees: a chain sampled from the drafter, or an EAGLE-2 dynamic tree from its top-k expansions.

A tree holds the root (the last committed token, not yet in the target's KV cache) at index 0 and the draft
tokens after it, parents before children. One target forward over all nodes, with the ancestor mask from
`tree_attention_mask` and positions `cache_len + depths`, yields the target distribution at every node.

The drafter is reached through callbacks, so any draft model (EAGLE head, small LM, test stand-in) can drive
the same search. Trees use expand(node_ids [B, m], parent_ids [B, m], tokens [B, m]) -> raw logits [B, m, V]
for the next token after each node. Node ids are search ids: 0 is the root, new candidates count up from 1 in
creation order, and every parent id passed to expand was itself passed (or is the root) earlier. Chains use
extend(depth, tokens [B]) -> raw logits [B, V]: node `depth` below node `depth - 1` in every row, which a
drafter can serve without any ancestor bookkeeping (`chain_from_expand` derives it from an expand callback).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from verl_tlt.spec.draws import draw_rows, multinomial_rows
from verl_tlt.spec.logits import LogitsParams, first_argmax
from verl_tlt.spec.strategy import SpecStrategy

ExpandFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ChainExtendFn = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass
class DraftTree:
    """A batch of draft trees of equal size; index 0 of each row is the root.

    tokens, parents, depths: [B, N+1] long (parents[:, 0] = 0, parents[:, i] < i). draft_probs: [B, N+1, V] draft
    distribution each node's token was sampled from (sampled chains), or None when tokens were chosen
    deterministically (argmax / top-k); verification then treats each draft as a point mass.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    draft_probs: torch.Tensor | None = None
    is_chain: bool = False  # node i's parent is i - 1 in every row (verification can use a causal mask)

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


def chain_from_expand(expand: ExpandFn) -> ChainExtendFn:
    """A chain callback built on a tree callback: chain node d has search id d and parent d - 1."""

    def extend(depth: int, tokens: torch.Tensor) -> torch.Tensor:
        node_ids = torch.full((tokens.shape[0], 1), depth, dtype=torch.long, device=tokens.device)
        return expand(node_ids, node_ids - 1, tokens.unsqueeze(-1))[:, 0]

    return extend


def build_chain(
    root_tokens: torch.Tensor,
    root_logits: torch.Tensor,
    extend: ChainExtendFn,
    params: LogitsParams,
    depth: int,
    generators: list[torch.Generator | None],
    default_generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    forced: torch.Tensor | None = None,
) -> DraftTree:
    """Draft `depth` tokens per row: argmax for greedy rows, else a sample from the processed draft distribution.

    With `noise` [B, >= depth, V] (keyed Gumbel noise, zero on greedy rows; see keyed_noise) draft d is
    argmax(processed draft logits + noise[:, d - 1]), the drafter's own draw with the noise of the position it
    guesses, and the chain has no draft_probs: keyed verification compares draws and never reads q.

    With `forced` [B, depth] long, level d of a row takes forced[:, d - 1] where that is >= 0 instead of the drafter's
    token (a model-free draft the drafter then continues); it is a point mass, so its draft distribution is one-hot.

    Args:
        root_tokens: [B] last committed token per row. root_logits: [B, V] raw draft logits after it.
        extend: the drafter's chain callback (see the module docstring).
        generators: per-row generator (None = default_generator) for the draft samples.
    Returns:
        DraftTree with draft_probs set (speculative sampling needs q for min(1, p/q) and the residual), or None
        when every row is greedy: greedy verification never reads q, so the chain is just argmaxes of the raw
        logits (processing cannot move the argmax: temperature is 1 for greedy rows and top-k/top-p keep the top).
    """
    rows, device = root_tokens.shape[0], root_tokens.device
    sampled_rows = [row for row, greedy in enumerate(params.greedy_rows) if not greedy]
    all_greedy = not sampled_rows
    keyed = noise is not None and not all_greedy
    sampled = torch.tensor(sampled_rows, dtype=torch.long, device=device)
    tokens, probs = [root_tokens], [] if all_greedy or keyed else [torch.zeros_like(root_logits, dtype=torch.float32)]
    logits = root_logits
    for level in range(1, depth + 1):
        if all_greedy:
            drafted = first_argmax(logits)
        elif keyed:
            drafted = first_argmax(params.process(logits) + noise[:, level - 1])
        else:
            draft_probs = params.process(logits).softmax(dim=-1)  # [B, V]
            drafted = first_argmax(draft_probs)
            drafted[sampled] = draw_rows(
                sampled_rows, generators, default_generator, multinomial_rows(draft_probs[sampled])
            )
            probs.append(draft_probs)
        if forced is not None:
            taken = forced[:, level - 1] >= 0  # [B]
            drafted = torch.where(taken, forced[:, level - 1], drafted)
            if probs and not (all_greedy or keyed):
                one_hot = torch.nn.functional.one_hot(drafted, probs[-1].shape[-1]).to(probs[-1].dtype)
                probs[-1] = torch.where(taken.unsqueeze(-1), one_hot, probs[-1])
        tokens.append(drafted)
        if level < depth:
            logits = extend(level, drafted)
    positions = torch.arange(depth + 1, device=device).expand(rows, depth + 1)
    parents = (positions - 1).clamp(min=0)
    draft_probs = None if all_greedy or keyed else torch.stack(probs, dim=1)
    return DraftTree(torch.stack(tokens, dim=1), parents, positions.clone(), draft_probs, is_chain=True)


def build_eagle2_tree(
    root_tokens: torch.Tensor,
    root_logits: torch.Tensor,
    expand: ExpandFn,
    params: LogitsParams,
    strategy: SpecStrategy,
) -> DraftTree:
    """EAGLE-2 dynamic tree: expand the top_k best nodes per level, keep the tree_tokens best nodes overall.

    A node's score is the sum of processed draft log-probs along its path. Each level expands the top_k
    highest-scoring candidates of the previous level (their top_k children each become candidates); the final
    tree keeps the `tree_tokens` highest-scoring candidates. Scores never increase along a path and ties go to the
    older node, so every kept node's parent is kept too. Drafts are deterministic (top-k), so verification treats
    them as point masses, which keeps sampled verification lossless.

    Args:
        root_tokens: [B] long. root_logits: [B, V] raw draft logits after the root.
    Returns:
        DraftTree with N = strategy.tree_tokens draft nodes per row and draft_probs None.
    """
    device, rows, top_k = root_tokens.device, root_tokens.shape[0], strategy.top_k
    log_probs = params.process(root_logits).log_softmax(dim=-1)  # [B, V]
    scores, tokens = log_probs.topk(top_k, dim=-1)  # [B, k]
    node_ids = torch.arange(1, top_k + 1, device=device).expand(rows, top_k)
    all_tokens, all_parents, all_scores = [tokens], [torch.zeros_like(tokens)], [scores]
    all_depths = [torch.ones_like(tokens)]
    frontier_ids, frontier_tokens, frontier_scores, frontier_parents = node_ids, tokens, scores, all_parents[0]
    next_id = top_k + 1
    for level in range(2, strategy.depth + 1):
        logits = expand(frontier_ids, frontier_parents, frontier_tokens)  # [B, k, V]
        child_scores, child_tokens = params.process(logits).log_softmax(dim=-1).topk(top_k, dim=-1)  # [B, k, k]
        scores = (frontier_scores.unsqueeze(-1) + child_scores).reshape(rows, top_k * top_k)
        tokens = child_tokens.reshape(rows, top_k * top_k)
        parents = frontier_ids.repeat_interleave(top_k, dim=1)
        ids = torch.arange(next_id, next_id + top_k * top_k, device=device).expand(rows, top_k * top_k)
        next_id += top_k * top_k
        all_tokens.append(tokens)
        all_parents.append(parents)
        all_scores.append(scores)
        all_depths.append(torch.full_like(tokens, level))
        best = _stable_top(scores, top_k)
        frontier_ids, frontier_tokens = ids.gather(1, best), tokens.gather(1, best)
        frontier_scores, frontier_parents = scores.gather(1, best), parents.gather(1, best)
    return _select_tree(
        root_tokens,
        torch.cat(all_tokens, 1),
        torch.cat(all_parents, 1),
        torch.cat(all_depths, 1),
        torch.cat(all_scores, 1),
        strategy.tree_tokens,
    )


def tree_attention_mask(parents: torch.Tensor) -> torch.Tensor:
    """[B, N+1, N+1] bool: node i may attend to node j iff j is i or one of its ancestors."""
    rows, num_nodes = parents.shape
    mask = torch.zeros(rows, num_nodes, num_nodes, dtype=torch.bool, device=parents.device)
    mask[:, 0, 0] = True
    batch = torch.arange(rows, device=parents.device)
    for node in range(1, num_nodes):
        mask[:, node] = mask[batch, parents[:, node]]
        mask[:, node, node] = True
    return mask


def _stable_top(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the `count` highest scores per row; ties go to the lower index (older node)."""
    return torch.sort(-scores, dim=-1, stable=True).indices[:, :count]


def _select_tree(root_tokens, tokens, parents, depths, scores, tree_tokens: int) -> DraftTree:
    """Keep the best `tree_tokens` candidates (search ids 1..C) and renumber them 1..N in creation order."""
    rows, device = tokens.shape[0], tokens.device
    keep = _stable_top(scores, tree_tokens).sort(dim=-1).values  # [B, N] candidate positions, creation order
    new_index = torch.zeros(rows, tokens.shape[1] + 1, dtype=torch.long, device=device)  # search id -> tree index
    new_index.scatter_(1, keep + 1, torch.arange(1, tree_tokens + 1, device=device).expand(rows, tree_tokens))
    kept_parents = parents.gather(1, keep)
    remapped = new_index.gather(1, kept_parents)
    if bool(((remapped == 0) & (kept_parents != 0)).any()):
        raise AssertionError("EAGLE-2 tree selection kept a node without its parent (scores not monotone)")
    zero = torch.zeros(rows, 1, dtype=torch.long, device=device)
    return DraftTree(
        tokens=torch.cat([root_tokens.unsqueeze(1), tokens.gather(1, keep)], 1),
        parents=torch.cat([zero, remapped], 1),
        depths=torch.cat([zero, depths.gather(1, keep)], 1),
    )
