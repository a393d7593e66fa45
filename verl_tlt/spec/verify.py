"""Lossless verification of a draft tree (a chain is a tree with one child per node).

Given the target's processed logits at every tree node (one forward), walk down from the root:
- greedy rows follow the child whose token is the target's argmax, and emit the argmax where none matches;
- sampled rows run recursive rejection sampling over the children of the current node (SpecInfer / EAGLE):
  child x drafted from q is accepted with probability min(1, r(x) / q(x)), where r starts as the target
  distribution p; after a rejection r becomes normalize(max(r - q, 0)); if every child is rejected, one token
  is sampled from r. With a single child sampled from q this is standard speculative sampling (accept with
  min(1, p/q), else sample the residual); with deterministic drafts q is a point mass on the drafted token, so
  each rejection just removes that token from r. Either way the emitted token at each node has exactly
  distribution p, and a node without children yields the bonus token sampled from p.
Keyed sampling (`verify_keyed`, see keyed_noise) needs neither: it is the greedy walk on logits perturbed with the
noise of each node's position, and emits exactly what plain decoding with the same noise emits.

The emitted tokens are path[1:]'s tokens plus one final token; token j comes from the distribution at path[j],
so log-probs for emitted tokens are read at those nodes (`emitted_positions` gives them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl_tlt.spec.draws import draw_rows, multinomial_rows
from verl_tlt.spec.logits import first_argmax
from verl_tlt.spec.tree import DraftTree

# Below this residual mass the residual is treated as exhausted (only reachable through rounding).
_RESIDUAL_EPS = 1e-12


@dataclass
class VerifyResult:
    """One row's outcome. path: accepted tree nodes, root first. tokens: emitted tokens; tokens[j] was drawn from
    the target distribution at node path[j], so len(tokens) == len(path) and num_accepted == len(path) - 1."""

    path: list[int]
    tokens: list[int]

    @property
    def num_accepted(self) -> int:
        return len(self.path) - 1


def verify_tree(
    tree: DraftTree,
    target_logits: torch.Tensor,
    is_greedy: torch.Tensor,
    generators: list[torch.Generator | None],
    default_generator: torch.Generator | None = None,
) -> list[VerifyResult]:
    """Accept the longest lossless prefix of each row's draft tree and emit one more token.

    Args:
        tree: draft trees, N+1 nodes per row (node 0 = root).
        target_logits: [B, N+1, V] target logits already processed with `process_logits` (fp32; -inf = masked).
        is_greedy: [B] bool.
        generators: per-row generator for the uniform and residual draws (None = default_generator).
    Returns:
        One VerifyResult per row.
    """
    if tree.is_chain:
        return _verify_chains(tree, target_logits, is_greedy, generators, default_generator)
    tokens = tree.tokens.tolist()
    parents = tree.parents.tolist()
    greedy = is_greedy.tolist()
    results = []
    for row in range(len(tokens)):
        children = _children(parents[row])
        if greedy[row]:
            results.append(_walk_greedy(target_logits[row], tokens[row], children))
        else:
            draft_probs = None if tree.draft_probs is None else tree.draft_probs[row]
            generator = generators[row] or default_generator
            target_probs = target_logits[row].softmax(dim=-1)  # [N+1, V]
            results.append(_walk_sampled(target_probs, draft_probs, tokens[row], children, generator))
    return results


def verify_keyed(tree: DraftTree, target_logits: torch.Tensor, noise: torch.Tensor) -> list[VerifyResult]:
    """Keyed verification (see keyed_noise): node d's token is the target's draw argmax(logits + noise[:, d]) at the
    row's next position + d; drafts are accepted while they equal those draws, and the first draw that no child
    matches is emitted. That is the greedy walk on the perturbed logits, so the emitted tokens are exactly the ones
    plain decoding with the same noise emits.

    Args:
        tree: draft trees, N+1 nodes per row. target_logits: [B, N+1, V] processed target logits.
        noise: [B, >= depth + 1, V] keyed Gumbel noise of each row's next positions (zero on greedy rows).
    """
    depths = tree.depths.unsqueeze(-1).expand_as(target_logits)
    node_noise = noise[:, : tree.num_nodes] if tree.is_chain else noise.gather(1, depths)
    every_row = torch.ones(target_logits.shape[0], dtype=torch.bool, device=target_logits.device)
    return verify_tree(tree, target_logits + node_noise, every_row, [None] * target_logits.shape[0])


def emitted_positions(
    results: list[VerifyResult], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flattened (row, node, token) index tensors of every emitted token on `device` (the logits'), for gathering
    log-probs."""
    rows = [row for row, result in enumerate(results) for _ in result.tokens]
    nodes = [node for result in results for node in result.path]
    tokens = [token for result in results for token in result.tokens]
    return tuple(torch.tensor(values, device=device) for values in (rows, nodes, tokens))


def _children(parents: list[int]) -> list[list[int]]:
    children: list[list[int]] = [[] for _ in parents]
    for node in range(1, len(parents)):
        children[parents[node]].append(node)
    return children


def _walk_greedy(logits: torch.Tensor, tokens: list[int], children: list[list[int]]) -> VerifyResult:
    argmax = first_argmax(logits).tolist()  # [N+1]
    path, emitted, node = [0], [], 0
    while True:
        target_token = argmax[node]
        emitted.append(target_token)
        match = next((child for child in children[node] if tokens[child] == target_token), None)
        if match is None:
            return VerifyResult(path, emitted)
        path.append(match)
        node = match


def _walk_sampled(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    tokens: list[int],
    children: list[list[int]],
    generator: torch.Generator | None,
) -> VerifyResult:
    path, emitted, node = [0], [], 0
    while True:
        residual = target_probs[node]
        accepted = None
        for child in children[node]:
            token = tokens[child]
            draft_prob = 1.0 if draft_probs is None else float(draft_probs[child, token])
            uniform = float(torch.rand((), generator=generator, device=residual.device))
            if uniform * draft_prob < float(residual[token]):
                accepted = child
                break
            residual = _reject(residual, token, None if draft_probs is None else draft_probs[child])
        if accepted is None:
            emitted.append(int(torch.multinomial(residual, 1, generator=generator)[0]))
            return VerifyResult(path, emitted)
        emitted.append(tokens[accepted])
        path.append(accepted)
        node = accepted


def _verify_chains(
    tree: DraftTree,
    target_logits: torch.Tensor,
    is_greedy: torch.Tensor,
    generators: list[torch.Generator | None],
    default_generator: torch.Generator | None,
) -> list[VerifyResult]:
    """verify_tree for chains, vectorised over rows: the same acceptance rule as the tree walk, a few tensor ops per
    batch instead of a few per node. Greedy rows take the longest prefix matching the target's argmax; sampled rows
    accept draft i while u_i * q_i(x_i) < p_i(x_i) and then draw one token from the residual at the first rejection
    (or from p after the last node). Each row draws its uniforms and its final token from its own generator when it
    has one, so its samples do not depend on the rest of the batch."""
    rows, num_nodes = tree.tokens.shape
    depth = num_nodes - 1
    drafted = tree.tokens[:, 1:]  # [B, k]; drafted[:, i] is node i + 1, drawn from the drafter at node i
    greedy = is_greedy.tolist()
    greedy_rows = [row for row in range(rows) if greedy[row]]
    sampled_rows = [row for row in range(rows) if not greedy[row]]
    if not sampled_rows:  # every row greedy (the common batch): no row selection, a handful of ops in all
        accepted, final = _greedy_chain_verdicts(target_logits, drafted)
    else:
        accepted = torch.zeros(rows, dtype=torch.long, device=tree.tokens.device)
        final = torch.zeros(rows, dtype=torch.long, device=tree.tokens.device)
    if sampled_rows and greedy_rows:
        index = torch.tensor(greedy_rows, device=tree.tokens.device)
        accepted[index], final[index] = _greedy_chain_verdicts(target_logits[index], drafted[index])
    if sampled_rows:
        index = torch.tensor(sampled_rows, device=tree.tokens.device)
        probs = target_logits[index].softmax(dim=-1)  # [S, N+1, V]
        tokens = drafted[index]
        p = probs[:, :-1].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [S, k]: target prob of each draft
        if tree.draft_probs is None:  # point-mass drafts
            draft_dists, q = None, torch.ones_like(p)
        else:
            draft_dists = tree.draft_probs[index, 1:]  # [S, k, V]
            q = draft_dists.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        uniforms = draw_rows(
            sampled_rows, generators, default_generator, lambda g, n: torch.rand(n, depth, generator=g, device=p.device)
        )
        count = (uniforms * q < p).long().cumprod(dim=-1).sum(dim=-1)  # [S] accepted drafts per row
        arange = torch.arange(len(sampled_rows), device=p.device)
        at = probs[arange, count]  # p at the node after the last accepted draft: [S, V]
        rejected = count < depth
        stop = count.clamp(max=depth - 1)  # the rejected draft (ignored where nothing was rejected)
        residual = _reject(at, tokens[arange, stop], None if draft_dists is None else draft_dists[arange, stop])
        last = torch.where(rejected.unsqueeze(-1), residual, at)
        final[index] = draw_rows(sampled_rows, generators, default_generator, multinomial_rows(last)).view(-1)
        accepted[index] = count
    counts, finals, drafts = accepted.tolist(), final.tolist(), drafted.tolist()
    return [
        VerifyResult(list(range(counts[row] + 1)), drafts[row][: counts[row]] + [finals[row]]) for row in range(rows)
    ]


def _greedy_chain_verdicts(target_logits: torch.Tensor, drafted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted draft count [G] (the longest prefix equal to the target's argmax) and the token emitted after it."""
    argmax = first_argmax(target_logits)  # [G, N+1]
    count = (drafted == argmax[:, :-1]).long().cumprod(dim=-1).sum(dim=-1)
    return count, argmax.gather(1, count.unsqueeze(1)).squeeze(1)


def _reject(residual: torch.Tensor, token, draft_probs: torch.Tensor | None) -> torch.Tensor:
    """normalize(max(r - q, 0)) for r [..., V]; q is the point mass on `token` when draft_probs is None.

    Works on one distribution (token an int) or a batch of rows (token a tensor of the leading shape)."""
    if draft_probs is None:
        index = torch.as_tensor(token, device=residual.device).reshape(*residual.shape[:-1], 1)
        updated = residual.scatter(-1, index, 0.0)
    else:
        updated = (residual - draft_probs).clamp(min=0.0)
    mass = updated.sum(dim=-1, keepdim=True)
    # Where r == q up to rounding, a rejection had probability ~0, and r itself is the right distribution.
    return torch.where(mass <= _RESIDUAL_EPS, residual, updated / mass.clamp(min=_RESIDUAL_EPS))
