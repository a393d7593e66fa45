"""Lossless verification: greedy SD equals greedy decoding; sampled SD has exactly the target distribution."""

from __future__ import annotations

import pytest
import torch

from tests.spec.sd_harness import TableModel, blend, chi_square_pvalue, exact_distribution, mean, speculative_sample
from verl_tlt.spec import verify as verify_module
from verl_tlt.spec.logits import LogitsParams
from verl_tlt.spec.strategy import SpecStrategy
from verl_tlt.spec.tree import DraftTree
from verl_tlt.spec.verify import verify_tree

VOCAB, PROMPT, NUM_TOKENS, NUM_SAMPLES = 5, [1, 2], 3, 4000
# Each distribution test below is one chi-square test at this significance level: with a correct verifier a
# seed fails with probability ALPHA (the seeds are fixed, so the suite itself is deterministic).
ALPHA = 1e-3
CHAIN, TREE = SpecStrategy(depth=3), SpecStrategy(depth=3, top_k=2, tree_tokens=5)


def params_for(rows: int, temperature: float, top_k: int = -1, top_p: float = 1.0) -> LogitsParams:
    return LogitsParams.from_lists([temperature] * rows, [top_k] * rows, [top_p] * rows)


def models(weight: float = 0.6):
    target = TableModel(VOCAB, seed=0)
    return target, blend(target, TableModel(VOCAB, seed=1), weight)


def sample_distribution_pvalue(strategy, temperature, top_k=-1, top_p=1.0, verify=verify_tree, seed=0):
    target, drafter = models()
    params = params_for(NUM_SAMPLES, temperature, top_k, top_p)
    generator = torch.Generator().manual_seed(seed)
    samples, _ = speculative_sample(target, drafter, PROMPT, params, strategy, NUM_TOKENS, generator, verify)
    expected = exact_distribution(target, PROMPT, params, NUM_TOKENS)
    return chi_square_pvalue(samples, expected, VOCAB)


@pytest.mark.parametrize("strategy", [CHAIN, TREE], ids=["chain", "tree"])
@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, -1, 1.0), (0.6, -1, 1.0), (1.4, -1, 1.0), (1.0, 3, 1.0), (1.0, -1, 0.8), (0.8, 4, 0.9)],
)
def test_sampled_sd_matches_target_distribution(strategy, temperature, top_k, top_p):
    assert sample_distribution_pvalue(strategy, temperature, top_k, top_p) > ALPHA


def _accept_without_ratio(tree, target_logits, is_greedy, generators, default_generator=None):
    """A broken verifier: accepts every draft token along the first-child path (no min(1, p/q) test)."""
    results = []
    parents = tree.parents.tolist()
    for row in range(tree.tokens.shape[0]):
        path = [0]
        while (
            child := next((n for n in range(1, len(parents[row])) if parents[row][n] == path[-1]), None)
        ) is not None:
            path.append(child)
        bonus = int(torch.multinomial(target_logits[row, path[-1]].softmax(-1), 1, generator=default_generator)[0])
        results.append(verify_module.VerifyResult(path, [int(tree.tokens[row, n]) for n in path[1:]] + [bonus]))
    return results


@pytest.mark.parametrize("strategy", [CHAIN, TREE], ids=["chain", "tree"])
def test_distribution_test_rejects_verifier_that_skips_the_ratio(strategy):
    assert sample_distribution_pvalue(strategy, 1.0, verify=_accept_without_ratio) < 1e-6


@pytest.mark.parametrize("strategy", [CHAIN, TREE], ids=["chain", "tree"])
def test_distribution_test_rejects_resampling_from_target_instead_of_residual(strategy, monkeypatch):
    # The SPEC-RL bug: after a rejection, sample from p instead of the residual, which over-weights drafts.
    monkeypatch.setattr(verify_module, "_reject", lambda residual, token, draft_probs: residual)
    assert sample_distribution_pvalue(strategy, 1.0) < 1e-6


def greedy_reference(target: TableModel, prompt: list[int], num_tokens: int) -> list[int]:
    sequence = list(prompt)
    for _ in range(num_tokens):
        sequence.append(int(target.logits([sequence])[0].argmax()))
    return sequence[len(prompt) :]


@pytest.mark.parametrize("strategy", [CHAIN, TREE, SpecStrategy(4, 3, 12)], ids=["chain", "tree", "wide"])
@pytest.mark.parametrize("weight", [0.0, 0.5, 1.0], ids=["perfect", "similar", "unrelated"])
def test_greedy_sd_is_token_identical_to_greedy_decoding(strategy, weight):
    target, drafter = models(weight)
    params = params_for(3, 0.0)
    tokens, _ = speculative_sample(target, drafter, PROMPT, params, strategy, 12, torch.Generator().manual_seed(0))
    expected = greedy_reference(target, PROMPT, 12)
    assert tokens.tolist() == [expected] * 3


def test_perfect_drafter_is_always_fully_accepted():
    target, drafter = models(weight=0.0)
    generator = torch.Generator().manual_seed(0)
    # Sampled chain: q == p, so min(1, p/q) = 1 for every draft token. Greedy tree: the argmax path is always in
    # the expanded frontier, and with every candidate kept (2 + 3 * 4 = 14) it is verified whole.
    for strategy, temperature in [(SpecStrategy(4), 1.0), (SpecStrategy(4), 0.0), (SpecStrategy(4, 2, 14), 0.0)]:
        _, per_step = speculative_sample(target, drafter, PROMPT, params_for(64, temperature), strategy, 10, generator)
        assert per_step and all(n == strategy.depth + 1 for n in per_step), (strategy, temperature)


def test_adversarial_drafter_accepts_nothing_and_output_stays_exact():
    target = TableModel(VOCAB, seed=0)
    adversary = TableModel.__new__(TableModel)
    adversary.vocab_size, adversary.periods, adversary.table = VOCAB, target.periods, -target.table
    _, per_step = speculative_sample(target, adversary, PROMPT, params_for(4, 0.0), CHAIN, 8, torch.Generator())
    assert set(per_step) == {1}
    tokens, _ = speculative_sample(target, adversary, PROMPT, params_for(4, 0.0), TREE, 8, torch.Generator())
    assert tokens.tolist() == [greedy_reference(target, PROMPT, 8)] * 4


def test_top_k_mask_makes_drafts_outside_support_rejected():
    # The target allows only its top-1 token (top_k=1); a draft of any other token must never be emitted.
    tree = DraftTree(
        tokens=torch.tensor([[0, 3, 1]]), parents=torch.tensor([[0, 0, 0]]), depths=torch.tensor([[0, 1, 1]])
    )
    logits = torch.tensor([[[0.0, 2.0, 1.0, 0.5, 0.1]] * 3])
    params = params_for(1, 1.0, top_k=1)
    for seed in range(20):
        (result,) = verify_tree(
            tree, params.process(logits), params.is_greedy, [None], torch.Generator().manual_seed(seed)
        )
        assert result.tokens[0] == 1


def test_similar_drafter_accepts_more_than_unrelated():
    generator = torch.Generator().manual_seed(0)
    lengths = {}
    for weight in (0.2, 1.0):
        target, drafter = models(weight)
        _, per_step = speculative_sample(target, drafter, PROMPT, params_for(256, 1.0), TREE, 6, generator)
        lengths[weight] = mean(per_step)
    assert lengths[0.2] > lengths[1.0] + 0.3, lengths


def test_emitted_positions_are_built_on_the_logits_device():
    """On CUDA the log-prob gather indexes CUDA logits: CPU index tensors failed there (found on an H200)."""
    from verl_tlt.spec.verify import VerifyResult, emitted_positions

    results = [VerifyResult(path=[0, 1], tokens=[7, 8]), VerifyResult(path=[0], tokens=[9])]
    rows, nodes, tokens = emitted_positions(results, "meta")
    assert {t.device.type for t in (rows, nodes, tokens)} == {"meta"}
    rows, nodes, tokens = emitted_positions(results)
    assert (rows.tolist(), nodes.tolist(), tokens.tolist()) == ([0, 0, 1], [0, 1, 0], [7, 8, 9])
