"""Draft trees from model-free proposals (`suffix_index.SuffixProposal`): point-mass drafts for the verifier.

A proposal's tokens are deterministic functions of text already committed (the request's and its group's), so the
verifier treats each as a point mass (`DraftTree.draft_probs` None): greedy and keyed verification accept a draft
exactly when it is the target's draw, and rejection sampling accepts token x with probability p(x) and removes it
from the residual otherwise. Either way the emitted tokens keep the target's distribution, whatever was proposed.

Rows of one batch propose different amounts; the tree tensors need one size, so short rows are padded. A chain
pads by repeating its last token (a draft like any other: accepted only where it is the target's draw), a tree by
extra children of the root that repeat its first token (a repeated child is rejected after its twin: the residual
no longer holds its token).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verl_tlt.spec.suffix_index import SuffixProposal
from verl_tlt.spec.tree import DraftTree


def proposal_chain_tokens(proposals: Sequence[SuffixProposal | None], depth: int) -> list[list[int]]:
    """Each row's proposed chain (at most `depth` tokens; [] without a proposal).

    A tree proposal contributes its first path (node 1, then each node's first child): what a chain can use of it."""
    chains = []
    for proposal in proposals:
        chain: list[int] = []
        if proposal is not None:
            node = 0
            for index, parent in enumerate(proposal.parents):
                if parent == node and len(chain) < depth:
                    chain.append(proposal.tokens[index])
                    node = index + 1
        chains.append(chain)
    return chains


def chain_from_proposals(root_tokens: torch.Tensor, chains: Sequence[Sequence[int]]) -> DraftTree | None:
    """A chain per row from proposed tokens (see proposal_chain_tokens), as deep as the longest; None if every row
    proposed nothing (the step has nothing to verify).

    Args:
        root_tokens: [B] long, each row's last committed token.
        chains: per row, the proposed tokens (may be empty).
    """
    depth = max((len(chain) for chain in chains), default=0)
    if depth == 0:
        return None
    rows = []
    for root, chain in zip(root_tokens.tolist(), chains, strict=True):
        filler = chain[-1] if chain else root
        rows.append([root, *chain, *[filler] * (depth - len(chain))])
    device = root_tokens.device
    positions = torch.arange(depth + 1, device=device).expand(len(rows), depth + 1)
    tokens = torch.tensor(rows, dtype=torch.long, device=device)
    return DraftTree(tokens, (positions - 1).clamp(min=0), positions.clone(), None, is_chain=True)


def tree_from_proposals(root_tokens: torch.Tensor, proposals: Sequence[SuffixProposal | None]) -> DraftTree | None:
    """Each row's proposed tree, padded to the largest with extra root children; None if no row proposed anything.

    Args:
        root_tokens: [B] long. proposals: per row, a proposal (parents before children) or None.
    """
    size = max((len(p.tokens) for p in proposals if p is not None), default=0)
    if size == 0:
        return None
    all_tokens, all_parents, all_depths = [], [], []
    for root, proposal in zip(root_tokens.tolist(), proposals, strict=True):
        tokens = list(proposal.tokens) if proposal is not None else []
        parents = list(proposal.parents) if proposal is not None else []
        depths = [0]
        for parent in parents:
            depths.append(depths[parent] + 1)
        filler = tokens[0] if tokens else root
        padding = size - len(tokens)
        all_tokens.append([root, *tokens, *[filler] * padding])
        all_parents.append([0, *parents, *[0] * padding])
        all_depths.append([*depths, *[1] * padding])
    device = root_tokens.device
    as_tensor = lambda rows: torch.tensor(rows, dtype=torch.long, device=device)  # noqa: E731
    return DraftTree(as_tensor(all_tokens), as_tensor(all_parents), as_tensor(all_depths), None)
