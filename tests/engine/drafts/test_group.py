"""GroupDrafts: which text a request's suffix drafts come from (its own, its siblings', the prompt's history)."""

from __future__ import annotations

import pytest

from verl_tlt.engine.drafts.group import GroupDrafts, PromptHistory
from verl_tlt.engine.request import Request
from verl_tlt.engine.sampling_params import SamplingParams
from verl_tlt.spec.strategy import SpecStrategy

CHAIN = SpecStrategy.parse("suffix:4_1_4")
PROMPT = [1, 2, 3]
ANSWER = [10, 11, 12, 13, 14, 15, 16]


def request(prompt=PROMPT, group="g", output=()) -> Request:
    req = Request("r", list(prompt), SamplingParams(max_tokens=100), None, 1000)
    req.group = group
    req.output_ids = list(output)
    return req


def finish(drafts: GroupDrafts, req: Request, output: list[int]) -> None:
    req.output_ids = list(output)
    req.finish_reason = "stop"
    drafts.retire(req)


def test_a_sibling_still_decoding_drafts_for_another():
    drafts = GroupDrafts(min_match=2)
    ahead, behind = request(), request()
    drafts.admit([ahead, behind])
    ahead.output_ids = list(ANSWER)
    behind.output_ids = ANSWER[:3]
    proposals = drafts.propose([ahead, behind], CHAIN)
    assert proposals[1].tokens == ANSWER[3:7]


def test_a_finished_sibling_drafts_until_the_whole_group_has_left():
    drafts = GroupDrafts(min_match=2, history_tokens=0)
    done, tail = request(), request()
    drafts.admit([done, tail])
    finish(drafts, done, ANSWER)
    tail.output_ids = ANSWER[:2]
    assert drafts.propose([tail], CHAIN)[0].tokens == ANSWER[2:6]
    finish(drafts, tail, ANSWER)
    assert drafts.num_groups == 0  # history_tokens=0: nothing kept


def test_requests_of_different_groups_or_without_a_group_do_not_share_text():
    drafts = GroupDrafts(min_match=2)
    other_group, no_group, mine = request(group="other"), request(group=None), request(group="g")
    other_no_group = request(group=None)
    drafts.admit([other_group, no_group, mine, other_no_group])
    other_group.output_ids = list(ANSWER)
    no_group.output_ids = list(ANSWER)
    mine.output_ids = ANSWER[:3]
    other_no_group.output_ids = ANSWER[:3]
    assert drafts.propose([mine, other_no_group], CHAIN) == [None, None]


def test_a_request_without_a_group_drafts_from_its_own_repetitions():
    drafts = GroupDrafts(min_match=2)
    loop = request(group=None)
    drafts.admit([loop])
    loop.output_ids = [7, 8, 9, 7, 8]
    assert drafts.propose([loop], CHAIN)[0].tokens == [9, 7, 8]


def test_the_prompts_earlier_answers_draft_for_its_next_group():
    drafts = GroupDrafts(min_match=2)
    first = request(group="step1")
    drafts.admit([first])
    finish(drafts, first, ANSWER)
    assert drafts.num_groups == 0 and len(drafts.history) == 1
    again, elsewhere = request(group="step2"), request(prompt=[4, 5, 6], group="step2b")
    drafts.admit([again, elsewhere])
    assert drafts.propose([again], CHAIN)[0].tokens == ANSWER[:4]  # from the prompt's end on
    elsewhere.output_ids = ANSWER[:3]
    assert drafts.propose([elsewhere], CHAIN) == [None]  # another prompt's history is not its text


def test_aborted_answers_and_answers_without_a_group_are_not_kept_as_history():
    drafts = GroupDrafts(min_match=2)
    aborted, solo = request(group="a"), request(group=None)
    drafts.admit([aborted, solo])
    aborted.output_ids, aborted.finish_reason = list(ANSWER), "abort"
    drafts.retire(aborted)
    finish(drafts, solo, ANSWER)
    assert len(drafts.history) == 0


def test_history_keeps_at_most_its_token_budget_oldest_out():
    history = PromptHistory(max_tokens=10)
    history.add(PROMPT, [1, 2, 3, 4])
    history.add([9], [5, 6, 7, 8])
    history.add(PROMPT, [9, 9, 9, 9])  # 12 tokens: the oldest answer goes
    assert history.num_tokens == 8
    assert history.answers(PROMPT) == [[9, 9, 9, 9]]
    assert history.answers([9]) == [[5, 6, 7, 8]]
    history.add(PROMPT, list(range(11)))  # larger than the whole budget: not kept
    assert history.num_tokens == 8


def test_reset_forgets_running_groups_but_keeps_history():
    drafts = GroupDrafts(min_match=2)
    first = request(group="x")
    drafts.admit([first])
    finish(drafts, first, ANSWER)
    running = request(group="y")
    drafts.admit([running])
    drafts.reset()
    assert drafts.num_groups == 0 and len(drafts.history) == 1
    drafts.retire(running)  # a request the reset dropped: nothing to do


def test_a_group_drafts_trees_in_the_strategys_shape():
    drafts = GroupDrafts(min_match=2)
    siblings = [request() for _ in range(3)]
    drafts.admit(siblings)
    siblings[0].output_ids = [10, 11, 12, 13]
    siblings[1].output_ids = [10, 11, 20, 21]
    siblings[2].output_ids = [10, 11]
    tree = drafts.propose(siblings, SpecStrategy.parse("suffix:2_2_3"))[2]
    assert len(tree.tokens) == 3  # tree_tokens
    assert sorted(t for t, parent in zip(tree.tokens, tree.parents, strict=True) if parent == 0) == [12, 20]


@pytest.mark.parametrize(("min_match", "history"), [(0, 10), (2, -1)])
def test_bad_settings_are_refused(min_match, history):
    with pytest.raises(ValueError, match="min_match|history_tokens"):
        GroupDrafts(min_match=min_match, history_tokens=history)
