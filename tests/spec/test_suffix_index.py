"""Suffix-index drafts: longest match, recency and frequency rules, trees, and memory across add/extend/drop."""

from __future__ import annotations

import random

import pytest

from verl_tlt.spec.suffix_index import SuffixIndex


def index_of(*docs: list[int], **kwargs) -> SuffixIndex:
    """An index holding `docs` as documents 0, 1, ... added in that order (the last is the most recent)."""
    index = SuffixIndex(**kwargs)
    for i, tokens in enumerate(docs):
        index.add(i, tokens)
    return index


def depths_of(parents: list[int]) -> list[int]:
    depths = [0]
    for parent in parents:
        depths.append(depths[parent] + 1)
    return depths[1:]


def test_the_longest_match_wins_over_a_shorter_more_recent_one():
    index = index_of([7, 1, 2, 3, 10], [5, 2, 3, 11], min_match=2)
    proposal = index.propose([7, 1, 2, 3], depth=1)
    assert (proposal.tokens, proposal.match_length, proposal.num_occurrences) == ([10], 4, 1)


def test_a_sibling_predicts_the_requests_next_tokens():
    index = SuffixIndex()
    index.add("own", [1, 2, 3, 4, 5])
    index.add("sibling", [1, 2, 3, 4, 5, 6, 7, 8])
    proposal = index.propose([1, 2, 3, 4, 5], depth=3)
    assert proposal.tokens == [6, 7, 8] and proposal.parents == [0, 1, 2]
    assert proposal.match_length == 5 and proposal.num_occurrences == 1


def test_a_repetition_inside_the_own_document_is_proposed():
    own = [1, 2, 3, 9, 1, 2, 3]
    index = index_of(own)
    proposal = index.propose(own, depth=2)
    assert (proposal.tokens, proposal.match_length) == ([9, 1], 3)


def test_no_proposal_for_a_query_shorter_than_min_match():
    index = index_of([1, 2, 3, 4], min_match=3)
    assert index.propose([2, 3], depth=2) is None


def test_no_proposal_when_no_occurrence_has_a_following_token():
    index = index_of([1, 2, 3])
    assert index.propose([1, 2, 3], depth=2) is None
    assert index.propose([4, 5, 6], depth=2) is None


def test_the_chain_stops_where_the_continuations_end_and_at_depth():
    index = index_of([1, 2, 3, 4, 5], min_match=2)
    assert index.propose([2, 3], depth=5).tokens == [4, 5]
    assert index.propose([2, 3], depth=1).tokens == [4]


def test_the_most_frequent_continuation_wins_over_a_more_recent_one():
    index = index_of([1, 2, 3, 8], [1, 2, 3, 8], [1, 2, 3, 7])
    proposal = index.propose([1, 2, 3], depth=1)
    assert proposal.tokens == [8] and proposal.num_occurrences == 3


def test_recency_breaks_frequency_ties():
    assert index_of([1, 2, 3, 7], [1, 2, 3, 8]).propose([1, 2, 3], depth=1).tokens == [8]
    assert index_of([1, 2, 3, 8], [1, 2, 3, 7]).propose([1, 2, 3], depth=1).tokens == [7]


def test_each_chain_level_counts_only_the_occurrences_below_the_chosen_token():
    # 5 wins level 1 (two occurrences); below it 6 and 9 tie and the more recent 9 wins, although 7 (under 4) is
    # the most recent token at level 2 overall.
    index = index_of([1, 2, 3, 5, 6], [1, 2, 3, 5, 9], [1, 2, 3, 4, 7])
    assert index.propose([1, 2, 3], depth=2).tokens == [5, 9]


def test_recency_is_the_order_tokens_were_added():
    index = SuffixIndex()
    index.add("early", [1, 2])
    index.add("late", [1, 2, 3, 8])
    index.extend("early", [3, 7])  # its (1, 2, 3) now ends later than the late document's
    assert index.propose([1, 2, 3], depth=1).tokens == [7]


def test_beyond_max_match_a_longer_match_no_longer_beats_a_more_recent_one():
    docs = [list(range(10)) + [42], [5, 6, 7, 8, 9, 43]]
    uncapped = index_of(*docs).propose(list(range(10)), depth=1)
    assert (uncapped.tokens, uncapped.match_length) == ([42], 10)
    capped = index_of(*docs, max_match=4).propose(list(range(10)), depth=1)
    assert (capped.tokens, capped.match_length, capped.num_occurrences) == ([43], 4, 2)


def test_max_occurrences_keeps_the_most_recent_occurrences():
    index = index_of(*[[1, 2, 3, 7]] * 3, *[[1, 2, 3, 8]] * 2, max_occurrences=2)
    proposal = index.propose([1, 2, 3], depth=1)
    assert proposal.tokens == [8] and proposal.num_occurrences == 2


def test_a_lookup_examines_at_most_max_candidates_recent_positions():
    # Every document matches the query's last 3 tokens only, so no early stop: only the cap ends the scan.
    index = index_of(*[[i, 1, 2, 3, i] for i in range(1000)], max_occurrences=2)
    proposal = index.propose([5000, 1, 2, 3], depth=1)
    assert index.max_candidates == 8 and index.last_num_examined == 8
    assert proposal.tokens == [999] and proposal.num_occurrences == 2


def test_the_tree_is_chosen_best_first_by_support_then_recency():
    index = index_of([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4], [1, 2, 6, 7], min_match=2)
    proposal = index.propose([1, 2], depth=2, top_k=2)
    # 3 (3 occurrences), 3->4 (2), then support 1 everywhere: 6 and 6->7 (newest document) before 3->5.
    assert proposal.tokens == [3, 4, 6, 7] and proposal.parents == [0, 1, 0, 3]
    assert proposal.num_occurrences == 4


def test_tree_nodes_keep_at_most_top_k_children():
    index = index_of([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 6])
    proposal = index.propose([1, 2, 3], depth=1, top_k=2, max_nodes=10)
    assert proposal.tokens == [6, 5] and proposal.parents == [0, 0]


def test_the_tree_respects_max_nodes_and_depth():
    docs = [[1, 2, 3, a, b, c] for a in range(3) for b in range(3) for c in range(3)]
    index = index_of(*docs)
    proposal = index.propose([1, 2, 3], depth=2, top_k=3, max_nodes=5)
    assert len(proposal.tokens) == 5 and max(depths_of(proposal.parents)) == 2
    assert len(index.propose([1, 2, 3], depth=3, top_k=3).tokens) == 9  # default max_nodes: depth * top_k


def test_a_top_k_1_tree_is_the_chain():
    docs = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9], [1, 2, 3, 7]]
    assert index_of(*docs).propose([1, 2, 3], depth=3, top_k=1).parents == [0, 1, 2]


def test_random_trees_are_well_formed():
    rng = random.Random(0)
    for _ in range(100):
        docs = [[rng.randrange(3) for _ in range(rng.randrange(40))] for _ in range(rng.randrange(1, 5))]
        depth, top_k = rng.randrange(1, 5), rng.randrange(1, 4)
        max_nodes = rng.choice([None, rng.randrange(1, 12)])
        index = index_of(*docs, min_match=2)
        proposal = index.propose([rng.randrange(3) for _ in range(4)], depth, top_k, max_nodes)
        if proposal is None:
            continue
        num_nodes = len(proposal.tokens)
        assert 1 <= num_nodes <= (depth * top_k if max_nodes is None else max_nodes)
        assert len(proposal.parents) == num_nodes
        assert all(0 <= parent < node for node, parent in enumerate(proposal.parents, start=1))
        assert max(depths_of(proposal.parents)) <= depth
        assert all(proposal.parents.count(node) <= top_k for node in range(num_nodes + 1))
        siblings = set(zip(proposal.parents, proposal.tokens, strict=True))
        assert len(siblings) == num_nodes  # no two children of one node carry the same token


def test_extended_tokens_become_matchable_and_predictable():
    index = SuffixIndex()
    index.add("own", [1, 2, 3])
    index.add("sibling", [1])
    for token in [2, 3]:  # grams that straddle add and extend are indexed too
        index.extend("sibling", [token])
    assert index.propose([1, 2, 3], depth=2) is None  # nothing follows either occurrence yet
    index.extend("sibling", [4])
    index.extend("sibling", [5])
    assert index.propose([1, 2, 3], depth=2).tokens == [4, 5]
    assert index.doc_length("sibling") == 5 and index.num_tokens == 8


def test_a_dropped_document_no_longer_proposes():
    index = index_of([1, 2, 3, 4], [1, 2, 3, 5])
    index.drop(1)
    assert index.propose([1, 2, 3], depth=1).tokens == [4]
    index.drop(0)
    assert index.propose([1, 2, 3], depth=1) is None
    assert len(index) == 0 and index.num_tokens == 0 and index.num_entries == 0


def test_re_adding_a_dropped_name_does_not_bring_back_its_old_text():
    index = SuffixIndex()
    index.add("a", [1, 2, 3, 4])
    index.add("keep", list(range(100, 200)))  # enough live entries that the drop stays lazy
    index.drop("a")
    index.add("a", [1, 2, 3, 9])
    proposal = index.propose([1, 2, 3], depth=1)
    assert proposal.tokens == [9] and proposal.num_occurrences == 1


def test_entries_stay_bounded_across_many_add_drop_cycles():
    rng = random.Random(0)
    index = SuffixIndex(min_match=2)
    index.add("prompt", [rng.randrange(5) for _ in range(50)])
    for cycle in range(500):
        index.add(cycle, [rng.randrange(5) for _ in range(rng.randrange(1, 80))])
        index.extend(cycle, [rng.randrange(5)])
        index.propose([rng.randrange(5) for _ in range(3)], depth=2)  # lookups purge what they meet
        index.drop(cycle)
        live_entries = index.num_tokens - len(index) * (index.min_match - 1)
        assert index.num_entries <= 2 * live_entries
    assert len(index) == 1 and index.num_tokens == 50


def test_documents_are_counted_and_looked_up_by_name():
    index = SuffixIndex()
    index.add("a", [1, 2])
    index.add(("b", 0))
    assert len(index) == 2 and "a" in index and ("b", 0) in index and "c" not in index
    assert index.doc_length(("b", 0)) == 0 and index.num_tokens == 2


@pytest.mark.parametrize("call", ["add", "extend", "drop", "doc_length"])
def test_unknown_or_duplicate_documents_are_errors(call):
    index = SuffixIndex()
    index.add("a", [1])
    with pytest.raises(ValueError, match="'a'" if call == "add" else "'b'"):
        if call == "add":
            index.add("a")
        elif call == "extend":
            index.extend("b", [1])
        else:
            getattr(index, call)("b")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"min_match": 0}, "min_match"),
        ({"min_match": 4, "max_match": 3}, "max_match"),
        ({"max_occurrences": 0}, "max_occurrences"),
    ],
)
def test_constructor_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SuffixIndex(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"depth": 0}, "depth"), ({"depth": 2, "top_k": 0}, "top_k"), ({"depth": 2, "max_nodes": 0}, "max_nodes")],
)
def test_propose_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SuffixIndex().propose([1, 2, 3], **kwargs)


def naive_chain(docs, query, depth, min_match, max_match):
    """(chain, match length, occurrences) by brute force; occurrences ranked newest first (later document, then
    later position), each chain level taking the most frequent next token among those still on the chain."""
    found = []  # (match length, document, end), end = one past the match
    for d, tokens in enumerate(docs):
        for end in range(1, len(tokens)):  # a following token is required
            length = 0
            while length < min(max_match, len(query), end) and tokens[end - length - 1] == query[-length - 1]:
                length += 1
            if length >= min_match:
                found.append((length, d, end))
    if not found:
        return None
    longest = max(length for length, _, _ in found)
    ranked = sorted(((d, end) for length, d, end in found if length == longest), reverse=True)
    chain, alive = [], ranked
    for level in range(depth):
        nexts = [docs[d][end + level] for d, end in alive if end + level < len(docs[d])]
        if not nexts:
            break
        counts = {token: nexts.count(token) for token in nexts}
        # max picks the first of equally frequent tokens in `nexts`, which is in recency order.
        token = max(nexts, key=lambda t: counts[t])
        chain.append(token)
        alive = [(d, end) for d, end in alive if end + level < len(docs[d]) and docs[d][end + level] == token]
    return chain, longest, len(ranked)


def test_the_chain_agrees_with_a_brute_force_search():
    rng = random.Random(0)
    num_compared = 0
    for _ in range(300):
        min_match = rng.randrange(1, 4)
        max_match = rng.randrange(min_match, 7)
        docs = [[rng.randrange(3) for _ in range(rng.randrange(30))] for _ in range(rng.randrange(1, 5))]
        index = SuffixIndex(min_match, max_match, max_occurrences=10_000)
        for d, tokens in enumerate(docs):  # one document at a time, so both rank by (document, position)
            cut = rng.randrange(len(tokens) + 1)
            index.add(d, tokens[:cut])
            for token in tokens[cut:]:
                index.extend(d, [token])
        own = rng.choice(docs)
        query = own[-rng.randrange(1, 9) :] if own and rng.random() < 0.5 else [rng.randrange(3) for _ in range(6)]
        depth = rng.randrange(1, 5)
        proposal = index.propose(query, depth)
        expected = naive_chain(docs, query, depth, min_match, max_match)
        if expected is None:
            assert proposal is None
            continue
        num_compared += 1
        assert (proposal.tokens, proposal.match_length, proposal.num_occurrences) == expected
        assert proposal.parents == list(range(len(proposal.tokens)))
    assert num_compared > 150
