"""Draft-tree construction details that the distribution tests do not pin down."""

from __future__ import annotations

import torch

from verl_tlt.engine.model_runner import tree_forward_layout
from verl_tlt.spec.logits import LogitsParams
from verl_tlt.spec.tree import DraftTree, build_chain, tree_attention_mask


def constant_extend(logits: torch.Tensor):
    calls = []

    def extend(depth: int, tokens: torch.Tensor) -> torch.Tensor:
        calls.append((depth, tokens.tolist()))
        return logits.expand(tokens.shape[0], -1)

    return extend, calls


def test_greedy_chain_takes_argmaxes_and_keeps_no_draft_distribution():
    root_logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    extend, calls = constant_extend(torch.tensor([[0.0, 0.0, 5.0]]))
    params = LogitsParams.from_lists([0.0, 0.0], [2, -1], [1.0, 0.5])
    tree = build_chain(torch.tensor([7, 8]), root_logits, extend, params, depth=3, generators=[None, None])
    assert tree.tokens.tolist() == [[7, 1, 2, 2], [8, 0, 2, 2]]
    assert tree.draft_probs is None and tree.is_chain
    assert calls == [(1, [1, 0]), (2, [2, 2])]  # the deepest node needs no extension


def test_sampled_chain_keeps_the_draft_distribution():
    extend, _ = constant_extend(torch.tensor([[0.0, 0.0, 5.0]]))
    params = LogitsParams.from_lists([0.0, 1.0], [-1, -1], [1.0, 1.0])
    tree = build_chain(torch.tensor([7, 8]), torch.zeros(2, 3), extend, params, 2, [None, None])
    assert tree.draft_probs is not None and tree.draft_probs.shape == (2, 3, 3)


def test_chain_layout_equals_the_general_tree_layout():
    cache_lens = torch.tensor([3, 6])
    parents = torch.tensor([[0, 0, 1, 2]] * 2)
    depths = torch.tensor([[0, 1, 2, 3]] * 2)
    tokens = torch.zeros(2, 4, dtype=torch.long)
    chain = tree_forward_layout(DraftTree(tokens, parents, depths, is_chain=True), cache_lens)
    general = tree_forward_layout(DraftTree(tokens, parents, depths), cache_lens)
    for chain_part, general_part in zip(chain, general, strict=True):
        assert torch.equal(chain_part, general_part)
    assert tree_attention_mask(parents)[0].equal(torch.ones(4, 4, dtype=torch.bool).tril())


def test_a_seeded_rows_chain_verdict_does_not_depend_on_its_batch():
    """Vectorised chain verification draws a seeded row's uniforms and final token from its own generator only."""
    from verl_tlt.spec.verify import verify_tree

    vocab, depth = 6, 4
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (3, depth + 1), generator=generator)
    draft_probs = torch.rand(3, depth + 1, vocab, generator=generator).softmax(-1)
    target_logits = torch.randn(3, depth + 1, vocab, generator=generator)
    positions = torch.arange(depth + 1).expand(3, -1)
    tree = DraftTree(tokens, (positions - 1).clamp(min=0), positions, draft_probs, is_chain=True)
    sampled = torch.tensor([False, False, False])

    def verdicts(rows, default_seed):
        sub = DraftTree(tokens[rows], tree.parents[rows], tree.depths[rows], draft_probs[rows], is_chain=True)
        own = [torch.Generator().manual_seed(7) if row == 1 else None for row in rows]
        default = torch.Generator().manual_seed(default_seed)
        return verify_tree(sub, target_logits[rows], sampled[rows], own, default)

    alone = verdicts([1], default_seed=0)[0]
    for rows, seed in (([0, 1, 2], 0), ([2, 1], 5), ([1, 0], 9)):
        result = verdicts(rows, seed)[rows.index(1)]
        assert (result.path, result.tokens) == (alone.path, alone.tokens)
    with_other_seed = [
        verify_tree(
            DraftTree(tokens[[1]], tree.parents[[1]], tree.depths[[1]], draft_probs[[1]], is_chain=True),
            target_logits[[1]],
            sampled[[1]],
            [torch.Generator().manual_seed(seed)],
        )[0].tokens
        for seed in range(20)
    ]
    assert len({tuple(t) for t in with_other_seed}) > 1  # the row's own seed does decide its draws
