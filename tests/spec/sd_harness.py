"""A pure speculative-decoding loop over table "models", for exact-distribution tests of spec/.

A TableModel's next-token logits depend on the prefix (its last two tokens and its length), so the target
distribution over the first few emitted tokens can be enumerated exactly and compared with SD samples.
"""

from __future__ import annotations

import itertools
import math

import torch

from verl_tlt.spec.logits import LogitsParams
from verl_tlt.spec.strategy import SpecStrategy
from verl_tlt.spec.tree import build_chain, build_eagle2_tree, chain_from_expand
from verl_tlt.spec.verify import verify_tree


class TableModel:
    def __init__(self, vocab_size: int, seed: int, scale: float = 1.5, periods: int = 4):
        generator = torch.Generator().manual_seed(seed)
        self.vocab_size, self.periods = vocab_size, periods
        self.table = scale * torch.randn(periods, vocab_size, vocab_size, vocab_size, generator=generator)

    def logits(self, prefixes: list[list[int]]) -> torch.Tensor:
        """[len(prefixes), V] next-token logits."""
        index = [(len(p) % self.periods, p[-2], p[-1]) for p in prefixes]
        a, b, c = (torch.tensor(i) for i in zip(*index, strict=True))
        return self.table[a, b, c]


def blend(target: TableModel, other: TableModel, weight: float) -> TableModel:
    """A drafter that resembles the target (weight 0 = the target itself)."""
    mixed = TableModel.__new__(TableModel)
    mixed.vocab_size, mixed.periods = target.vocab_size, target.periods
    mixed.table = (1 - weight) * target.table + weight * other.table
    return mixed


def speculative_sample(
    target: TableModel,
    drafter: TableModel,
    prompt: list[int],
    params: LogitsParams,
    strategy: SpecStrategy,
    num_tokens: int,
    generator: torch.Generator,
    verify=verify_tree,
) -> tuple[torch.Tensor, list[int]]:
    """Run SD for every row of params until each row has num_tokens; return [B, num_tokens] tokens and the
    number of tokens emitted per verify step for each round (for acceptance checks)."""
    rows = params.temperature.shape[0]
    sequences = [list(prompt) for _ in range(rows)]
    per_step = []
    while min(len(s) for s in sequences) < len(prompt) + num_tokens:
        node_prefix = [{0: seq} for seq in sequences]

        def expand(node_ids, parent_ids, tokens, node_prefix=node_prefix):
            prefixes = []
            for row in range(rows):
                triples = zip(node_ids[row].tolist(), parent_ids[row].tolist(), tokens[row].tolist(), strict=True)
                for node, parent, token in triples:
                    node_prefix[row][node] = node_prefix[row][parent] + [token]
                    prefixes.append(node_prefix[row][node])
            return drafter.logits(prefixes).view(rows, node_ids.shape[1], -1)

        root_tokens = torch.tensor([seq[-1] for seq in sequences])
        root_logits = drafter.logits(sequences)
        if strategy.is_chain:
            tree = build_chain(
                root_tokens, root_logits, chain_from_expand(expand), params, strategy.depth, [None] * rows, generator
            )
        else:
            tree = build_eagle2_tree(root_tokens, root_logits, expand, params, strategy)
        node_tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        prefixes = []
        for row in range(rows):
            paths = [sequences[row]]
            for node in range(1, tree.num_nodes):
                paths.append(paths[parents[row][node]] + [node_tokens[row][node]])
            prefixes.extend(paths)
        target_logits = params.process(target.logits(prefixes).view(rows, tree.num_nodes, -1))
        results = verify(tree, target_logits, params.is_greedy, [None] * rows, generator)
        for row, result in enumerate(results):
            sequences[row].extend(result.tokens)
            per_step.append(len(result.tokens))
    return torch.tensor([seq[len(prompt) : len(prompt) + num_tokens] for seq in sequences]), per_step


def exact_distribution(target: TableModel, prompt: list[int], params: LogitsParams, num_tokens: int) -> torch.Tensor:
    """[V ** num_tokens] probability of every continuation under the processed target (row 0's params)."""
    vocab = target.vocab_size
    single = LogitsParams(params.temperature[:1], params.top_k[:1], params.top_p[:1])
    probs = torch.zeros(vocab**num_tokens, dtype=torch.float64)
    for index, continuation in enumerate(itertools.product(range(vocab), repeat=num_tokens)):
        prob, prefix = 1.0, list(prompt)
        for token in continuation:
            prob *= float(single.process(target.logits([prefix])).softmax(-1)[0, token])
            prefix.append(token)
        probs[index] = prob
    return probs


def chi_square_pvalue(samples: torch.Tensor, expected_probs: torch.Tensor, vocab: int) -> float:
    """Pearson chi-square goodness of fit of sampled sequences [N, n] to expected_probs; cells with expected
    count < 5 are pooled into one cell. Returns the p-value (upper tail)."""
    num_samples, length = samples.shape
    codes = torch.zeros(num_samples, dtype=torch.long)
    for position in range(length):
        codes = codes * vocab + samples[:, position]
    observed = torch.bincount(codes, minlength=vocab**length).double()
    if bool((observed[expected_probs == 0] > 0).any()):
        return 0.0  # a continuation the target gives probability zero (e.g. outside top-k/top-p)
    observed, expected_probs = observed[expected_probs > 0], expected_probs[expected_probs > 0]
    expected = expected_probs * num_samples
    small = expected < 5
    observed = torch.cat([observed[~small], observed[small].sum().view(1)])
    expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    if expected[-1] == 0:  # nothing pooled
        observed, expected = observed[:-1], expected[:-1]
    statistic = float(((observed - expected) ** 2 / expected).sum())
    dof = len(expected) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(statistic / 2)))


def mean(values: list[int]) -> float:
    return math.fsum(values) / len(values)
