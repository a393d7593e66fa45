"""Model-free drafts for running requests from the text of their groups (GRPO siblings and earlier answers).

In group-based RL every prompt is answered n times, and the same prompts come back step after step. While the last
answers of a rollout decode, their siblings' answers (finished or still growing) and the prompt's answers from earlier
steps predict what comes next: the longest suffix of a request's tokens that occurs in that text is followed there by
a draft that costs no model compute (`verl_tlt.spec.suffix_index`). The engine's verifier checks those drafts like any
other, so they change nothing in what is sampled.

One `SuffixIndex` per group holds a document per member (prompt + output, extended as the member decodes) and the
prompt's earlier answers. A request without a group key is a group of its own: it drafts from its own tokens only.
When the last admitted member of a group leaves the engine, the group's answers join the prompt's history (bounded by
`history_tokens`, oldest first out) and its index is dropped, so the memory held is the running groups' text plus
the history budget.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from verl_tlt.engine.request import Request
from verl_tlt.spec.strategy import SpecStrategy
from verl_tlt.spec.suffix_index import SuffixIndex, SuffixProposal

# Longest suffix of a request's tokens compared with its group's text (longer matches add little certainty).
MAX_MATCH = 32
# Occurrences of the longest match whose continuations are counted for a draft.
MAX_OCCURRENCES = 32
# Finish reasons whose answers are kept as history: an aborted answer was cut off by the caller.
_HISTORY_REASONS = ("stop", "length")


class GroupDraftError(RuntimeError):
    """Group drafting failed (the engine then turns group drafts off, not the drafter)."""


class PromptHistory:
    """Earlier answers by prompt, at most `max_tokens` output tokens in all; the oldest answers go first."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.num_tokens = 0
        self._answers: OrderedDict[int, tuple[tuple[int, ...], list[int]]] = OrderedDict()  # serial -> prompt, output
        self._by_prompt: dict[tuple[int, ...], list[int]] = {}  # prompt -> serials, oldest first
        self._serials = itertools.count()

    def add(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        if not output or len(output) > self.max_tokens:
            return
        key = tuple(prompt)
        serial = next(self._serials)
        self._answers[serial] = (key, list(output))
        self._by_prompt.setdefault(key, []).append(serial)
        self.num_tokens += len(output)
        while self.num_tokens > self.max_tokens:
            _, (old_key, old_output) = self._answers.popitem(last=False)
            self.num_tokens -= len(old_output)
            serials = self._by_prompt[old_key]
            serials.pop(0)  # the oldest answer overall is the oldest of its prompt
            if not serials:
                del self._by_prompt[old_key]

    def answers(self, prompt: Sequence[int]) -> list[list[int]]:
        """The prompt's kept answers, oldest first."""
        return [self._answers[serial][1] for serial in self._by_prompt.get(tuple(prompt), ())]

    def __len__(self) -> int:
        return len(self._answers)


@dataclass
class _Group:
    index: SuffixIndex
    prompt: list[int]
    members: int = 0  # admitted members that have not left the engine
    answers: list[list[int]] = field(default_factory=list)  # outputs of the members that left, for the history


@dataclass
class _Member:
    group_key: Hashable
    num_synced: int  # output tokens already in the member's document


class GroupDrafts:
    """Suffix drafts for the engine's requests from their groups' text; see the module docstring.

    min_match: shortest matching suffix that yields a draft. history_tokens: budget of earlier answers (0 = none).
    """

    def __init__(self, min_match: int = 3, history_tokens: int = 1_000_000):
        if min_match < 1:
            raise ValueError(f"GroupDrafts min_match must be >= 1, got {min_match}")
        if history_tokens < 0:
            raise ValueError(f"GroupDrafts history_tokens must be >= 0, got {history_tokens}")
        self.min_match = min_match
        self.history = PromptHistory(history_tokens)
        self._groups: dict[Hashable, _Group] = {}
        self._members: dict[int, _Member] = {}  # Request.draft_doc -> member
        self._docs = itertools.count()

    # ----- membership ----------------------------------------------------------------------------------------

    def admit(self, requests: Sequence[Request]) -> None:
        """Index newly admitted requests (their prompts; outputs follow as they decode)."""
        for request in requests:
            doc = next(self._docs)
            request.draft_doc = doc
            # A request without a group key drafts from its own tokens only: a group of its own.
            key = ("group", request.group) if request.group is not None else ("solo", doc)
            group = self._groups.get(key)
            if group is None:
                group = self._open(key, request.prompt_ids, with_history=request.group is not None)
            group.members += 1
            group.index.add(doc, request.prompt_ids)
            self._members[doc] = _Member(key, 0)
            self._sync(request)

    def retire(self, request: Request) -> None:
        """The request left the engine: its answer stays for its siblings until the whole group has left."""
        member = self._members.pop(request.draft_doc, None)
        if member is None:
            return
        group = self._groups[member.group_key]
        self._extend(group, request, member)
        group.members -= 1
        if request.finish_reason in _HISTORY_REASONS and member.group_key[0] == "group":
            group.answers.append(list(request.output_ids))
        if group.members == 0:
            for answer in group.answers:
                self.history.add(group.prompt, answer)
            del self._groups[member.group_key]

    def reset(self) -> None:
        """Forget every running group (the engine dropped its requests); the history stays."""
        self._groups.clear()
        self._members.clear()

    @property
    def num_groups(self) -> int:
        return len(self._groups)

    # ----- drafting -------------------------------------------------------------------------------------------

    def propose(self, requests: Sequence[Request], strategy: SpecStrategy) -> list[SuffixProposal | None]:
        """A draft per running request (None where its group's text has no match), in the shape of `strategy`.

        Every request's document is brought up to date first, so siblings in the same batch see each other's latest
        tokens."""
        try:
            return self._propose(requests, strategy)
        except Exception as error:
            raise GroupDraftError(f"{type(error).__name__}: {error}") from error

    def _propose(self, requests: Sequence[Request], strategy: SpecStrategy) -> list[SuffixProposal | None]:
        for request in requests:
            self._sync(request)
        max_nodes = None if strategy.is_chain else strategy.tree_tokens
        proposals = []
        for request in requests:
            member = self._members.get(request.draft_doc)
            if member is None:  # admitted before group drafting began (the engine indexes from admission on)
                proposals.append(None)
                continue
            index = self._groups[member.group_key].index
            proposals.append(index.propose(_tail(request, MAX_MATCH), strategy.depth, strategy.top_k, max_nodes))
        return proposals

    # ----- internals ------------------------------------------------------------------------------------------

    def _open(self, key: Hashable, prompt: Sequence[int], with_history: bool) -> _Group:
        index = SuffixIndex(min_match=self.min_match, max_match=MAX_MATCH, max_occurrences=MAX_OCCURRENCES)
        group = _Group(index, list(prompt))
        if with_history:
            for number, answer in enumerate(self.history.answers(prompt)):
                index.add(("history", number), list(prompt) + answer)
        self._groups[key] = group
        return group

    def _sync(self, request: Request) -> None:
        member = self._members.get(request.draft_doc)
        if member is not None:
            self._extend(self._groups[member.group_key], request, member)

    @staticmethod
    def _extend(group: _Group, request: Request, member: _Member) -> None:
        new = request.output_ids[member.num_synced :]
        if new:
            group.index.extend(request.draft_doc, new)
            member.num_synced += len(new)


def _tail(request: Request, length: int) -> list[int]:
    """The request's last `length` tokens (prompt and output), without copying the whole sequence."""
    output = request.output_ids
    if len(output) >= length:
        return output[-length:]
    return request.prompt_ids[len(output) - length :] + output
