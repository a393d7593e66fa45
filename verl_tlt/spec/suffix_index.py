"""Model-free drafts from a GRPO group's own text (SuffixDecoding / prompt-lookup decoding).

Every prompt is answered n times, and the long answers that are still decoding late in a rollout can copy from what
their siblings (and the prompt's answers from earlier RL steps) wrote after the same context. A `SuffixIndex` holds
one group's documents (token-id lists: the request's own prompt + output, each sibling's, history answers) and
proposes, for a query (a request's recent tokens), the tokens that followed the longest suffix of the query found in
them, as a chain or a small tree. Verification elsewhere keeps the drafts lossless; this module only guesses.

Lookup: a dict maps every `min_match`-gram to the positions where it ends (entries, in the order they were added);
the query's last gram picks the candidates and each is extended backwards against the query, up to `max_match`.
Recency is that order of addition (a new document's tokens, then tokens appended by `extend`, are the newest), and
every cap keeps the most recent text. A lookup examines at most `max_candidates` (4 x max_occurrences) live
positions of its gram, the most recent ones, so a very frequent gram (a run of one token, a stock phrase) cannot
make it slow; an older, longer match beyond them is missed.

Memory is O(tokens in live documents): `drop` frees a document's tokens at once and its gram entries lazily, when a
lookup meets them or, at the latest, in a compaction once stale entries outnumber live ones.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

# Positions examined per lookup, per occurrence a proposal may use.
CANDIDATES_PER_OCCURRENCE = 4


@dataclass(frozen=True)
class SuffixProposal:
    """Draft tokens proposed after a query, as a tree rooted at the query's last token (node 0, not included).

    tokens[i] is node i+1; parents[i] is its parent's node number (0 = the root), always < i + 1, parents listed
    before children (creation order). A chain has parents == [0, 1, 2, ...].
    match_length: length of the query suffix that matched; num_occurrences: occurrences of that suffix (with at
    least one following token) the proposal was built from. supports[i]: how many of them continue with node i+1's
    path (supports[i] / num_occurrences estimates the chance the text goes that way).
    """

    tokens: list[int]
    parents: list[int]
    match_length: int
    num_occurrences: int
    supports: list[int] = field(default_factory=list)


class _Doc:
    """One document's tokens; gram entries point here, so a dropped document is recognised by `is_live`."""

    __slots__ = ("tokens", "is_live")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.is_live = True


class _Node:
    """Continuation trie node: how many used occurrences pass through it, and the rank (0 = most recent) of the
    most recent one, which breaks ties between equally supported nodes."""

    __slots__ = ("count", "rank", "children")

    def __init__(self, rank: int) -> None:
        self.count = 0
        self.rank = rank
        self.children: dict[int, _Node] = {}


def _check_at_least(name: str, value: int, least: int, why: str = "") -> None:
    if value < least:
        raise ValueError(f"SuffixIndex {name} must be >= {least}{why}, got {value}")


class SuffixIndex:
    """Documents of one group, indexed by `min_match`-grams, proposing drafts for a query (see the module doc)."""

    def __init__(self, min_match: int = 3, max_match: int = 32, max_occurrences: int = 64) -> None:
        _check_at_least("min_match", min_match, 1)
        _check_at_least("max_match", max_match, min_match, " (min_match)")
        _check_at_least("max_occurrences", max_occurrences, 1)
        self.min_match = min_match
        self.max_match = max_match
        self.max_occurrences = max_occurrences
        self.max_candidates = CANDIDATES_PER_OCCURRENCE * max_occurrences
        self._docs: dict[Hashable, _Doc] = {}
        self._grams: dict[tuple[int, ...], list[tuple[_Doc, int]]] = {}  # gram -> (document, end), oldest first
        self._num_entries = 0  # in _grams, stale ones included
        self._num_stale = 0  # entries that point to dropped documents
        self._num_tokens = 0
        self.last_num_examined = 0  # live positions the latest `propose` compared with its query

    def add(self, doc: Hashable, tokens: Sequence[int] = ()) -> None:
        """Index a new document; a name in use is an error (drop it first, or extend it)."""
        if doc in self._docs:
            raise ValueError(f"SuffixIndex already holds document {doc!r}; drop it first or extend it")
        self._docs[doc] = _Doc()
        self._append(self._docs[doc], tokens)

    def extend(self, doc: Hashable, tokens: Sequence[int]) -> None:
        """Append tokens to a document: O(min_match) per token, so one call per decoded token is cheap."""
        self._append(self._get(doc), tokens)

    def drop(self, doc: Hashable) -> None:
        """Forget a document: its tokens now, its gram entries lazily (see the module doc)."""
        entry = self._get(doc)
        del self._docs[doc]
        self._num_tokens -= len(entry.tokens)
        self._num_stale += max(0, len(entry.tokens) - self.min_match + 1)
        entry.is_live = False
        entry.tokens = []
        if self._num_stale > self._num_entries - self._num_stale:
            self._compact()

    def __contains__(self, doc: object) -> bool:
        return doc in self._docs

    def __len__(self) -> int:
        return len(self._docs)

    def doc_length(self, doc: Hashable) -> int:
        return len(self._get(doc).tokens)

    @property
    def num_tokens(self) -> int:
        """Tokens in all live documents."""
        return self._num_tokens

    @property
    def num_entries(self) -> int:
        """Gram entries held, stale ones (of dropped documents) included: at most twice the live ones after a drop."""
        return self._num_entries

    def propose(
        self, query: Sequence[int], depth: int, top_k: int = 1, max_nodes: int | None = None
    ) -> SuffixProposal | None:
        """Draft what followed the query's longest matching suffix: a chain (top_k=1) or a best-first tree.

        Uses the most recent occurrences (at most max_occurrences) of the longest suffix of `query` (min_match to
        max_match tokens) that some document continues. Tree nodes are chosen by support (occurrences through the
        node; ties: the more recent), at most top_k children per node, `depth` levels and `max_nodes` nodes
        (default depth * top_k); a chain follows the best child at every level. Returns None when nothing matches.
        """
        _check_at_least("depth", depth, 1)
        _check_at_least("top_k", top_k, 1)
        if max_nodes is not None:
            _check_at_least("max_nodes", max_nodes, 1)
        self.last_num_examined = 0
        if len(query) < self.min_match:
            return None
        found = self._longest_occurrences(list(query[-self.max_match :]))
        if found is None:
            return None
        match_length, occurrences = found
        trie = _count_continuations(occurrences, depth)
        tokens, parents, supports = _best_first(trie, depth, top_k, depth * top_k if max_nodes is None else max_nodes)
        return SuffixProposal(tokens, parents, match_length, len(occurrences), supports)

    def _get(self, doc: Hashable) -> _Doc:
        entry = self._docs.get(doc)
        if entry is None:
            raise ValueError(f"SuffixIndex holds no document {doc!r}; add it first")
        return entry

    def _append(self, entry: _Doc, tokens: Sequence[int]) -> None:
        seq = entry.tokens
        start = len(seq)
        seq.extend(tokens)
        self._num_tokens += len(seq) - start
        m = self.min_match
        # Only grams ending in the new tokens are new, including those that start before them.
        for end in range(max(start + 1, m), len(seq) + 1):
            key = tuple(seq[end - m : end])
            entries = self._grams.get(key)
            if entries is None:
                entries = self._grams[key] = []
            entries.append((entry, end))
            self._num_entries += 1

    def _longest_occurrences(self, tail: list[int]) -> tuple[int, list[tuple[_Doc, int]]] | None:
        """(longest match length, its most recent occurrences) for a query tail of <= max_match tokens, or None."""
        key = tuple(tail[-self.min_match :])
        entries = self._grams.get(key)
        if not entries:
            return None
        longest, cap = len(tail), self.max_occurrences
        best, used = 0, []
        examined = num_stale = 0
        i = len(entries)
        while i > 0 and examined < self.max_candidates:
            i -= 1
            doc, end = entries[i]
            if not doc.is_live:
                num_stale += 1
                continue
            examined += 1
            seq = doc.tokens
            if end >= len(seq):  # nothing follows it (yet), e.g. the query's own end
                continue
            length, limit = self.min_match, min(longest, end)
            while length < limit and seq[end - length - 1] == tail[-length - 1]:
                length += 1
            if length > best:
                best, used = length, [(doc, end)]
            elif length == best and len(used) < cap:
                used.append((doc, end))
            if best == longest and len(used) == cap:  # no later (older) candidate can change the result
                break
        self.last_num_examined = examined
        if num_stale:
            self._purge(key, entries, i, num_stale)
        return (best, used) if used else None

    def _purge(self, key: tuple[int, ...], entries: list[tuple[_Doc, int]], start: int, num_stale: int) -> None:
        """Remove the stale entries a lookup walked over (entries[start:]): the cost is that walk's, already paid."""
        entries[start:] = [e for e in entries[start:] if e[0].is_live]
        if not entries:
            del self._grams[key]
        self._num_entries -= num_stale
        self._num_stale -= num_stale

    def _compact(self) -> None:
        """Rebuild every gram list without stale entries: O(entries), run when at least half are stale."""
        grams = {}
        for key, entries in self._grams.items():
            live = [e for e in entries if e[0].is_live]
            if live:
                grams[key] = live
        self._grams = grams
        self._num_entries -= self._num_stale
        self._num_stale = 0


def _count_continuations(occurrences: list[tuple[_Doc, int]], depth: int) -> _Node:
    """Trie of the up-to-`depth` tokens after each occurrence (most recent first, so ranks follow recency)."""
    root = _Node(rank=0)
    for rank, (doc, end) in enumerate(occurrences):
        node = root
        for token in doc.tokens[end : end + depth]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node(rank)
            child.count += 1
            node = child
    return root


def _best_first(root: _Node, depth: int, top_k: int, max_nodes: int) -> tuple[list[int], list[int], list[int]]:
    """Choose trie nodes by support, numbering them in the order chosen (so parents precede children); returns their
    tokens, parents and supports."""
    tokens: list[int] = []
    parents: list[int] = []
    supports: list[int] = []
    # (-count, rank, tie, token, node, parent number, node depth). Siblings never share a rank (one occurrence
    # passes through one child), and the tie counter keeps the heap from ever comparing nodes.
    frontier: list[tuple[int, int, int, int, _Node, int, int]] = []
    tie = itertools.count()

    def push_children(node: _Node, number: int, node_depth: int) -> None:
        if node_depth == depth:
            return
        best = sorted(node.children.items(), key=lambda item: (-item[1].count, item[1].rank))[:top_k]
        for token, child in best:
            heapq.heappush(frontier, (-child.count, child.rank, next(tie), token, child, number, node_depth + 1))

    push_children(root, 0, 0)
    while frontier and len(tokens) < max_nodes:
        _, _, _, token, node, parent, node_depth = heapq.heappop(frontier)
        tokens.append(token)
        parents.append(parent)
        supports.append(node.count)
        push_children(node, len(tokens), node_depth)
    return tokens, parents, supports
