"""The csub task: its length distribution, its reference solutions and its reward rule."""

from __future__ import annotations

import random

import pytest

from verl_tlt.toy.task import (
    COMPACT,
    MAX_STEPS,
    PARTIAL_CREDIT_MAX,
    STANDARD,
    Problem,
    length_stats,
    make_problems,
    num_correct_leading_steps,
    parse_answer,
    parse_prompt,
    prompt_text,
    response_num_tokens,
    response_style,
    sample_problem,
    score,
    solution_steps,
    solution_text,
)


@pytest.fixture(scope="module")
def problems() -> list[Problem]:
    return make_problems(5000, seed=0)


def test_steps_have_a_heavy_tail_with_median_about_three(problems):
    stats = length_stats(problems)
    steps, tokens = stats["steps"], stats["response_tokens"]
    assert 3 <= steps["p50"] <= 4
    assert steps["p90"] >= 3 * steps["p50"]
    assert tokens["max"] >= 10 * tokens["p50"]
    assert 1 <= min(p.num_steps for p in problems) and steps["max"] <= MAX_STEPS


def test_sampled_problems_respect_the_task_ranges(problems):
    for p in problems:
        assert 2 <= p.d <= 9
        assert 0 <= p.answer < p.d
        assert p.n == p.num_steps * p.d + p.answer


def test_make_problems_is_reproducible_per_seed():
    assert make_problems(50, seed=3) == make_problems(50, seed=3)
    assert make_problems(50, seed=3) != make_problems(50, seed=4)
    assert sample_problem(random.Random(3)) == make_problems(1, seed=3)[0]


def test_solution_text_follows_the_documented_format():
    problem = Problem.from_nd(11, 4)
    assert prompt_text(problem) == "11 : 4"
    assert solution_text(problem) == "11 - 4 = 7 ; 7 - 4 = 3 ; 3 - 4 < 0 ; # 3"
    assert len(solution_steps(problem)) == problem.num_steps + 1
    assert parse_prompt("11:4") == problem


def test_reference_solutions_parse_to_the_answer_and_score_one(problems):
    for p in problems[:500]:
        assert parse_answer(solution_text(p)) == p.answer
        assert score(solution_text(p), str(p.answer), p) == 1.0
        assert score(solution_text(p), p.answer) == 1.0


def test_parse_answer_ignores_whitespace_between_tokens():
    assert parse_answer("11-4=7;7-4=3;3-4<0;#3") == 3
    assert parse_answer(" 1 1 - 4 = 7 ;\n 7 - 4 = 3 ; 3 - 4 < 0 ; #  3 ") == 3


@pytest.mark.parametrize(
    "response",
    [
        "",
        "11 - 4 = 7 ; 7 - 4 = 3 ;",  # truncated before the final step
        "11 - 4 = 7 ; 7 - 4 = 3 ; 3 - 4 < 0 ;",  # no answer
        "11 - 4 = 7 ; 7 - 4 = 3 ; 3 - 4 < 0 ; # 3 ;",  # trailing junk
        "# 3",  # answer without work
        "11 - 4 = 7 ; 7 - 4 = 3 ; 3 - 4 < 0 ; # -3",
    ],
)
def test_parse_answer_rejects_malformed_responses(response):
    assert parse_answer(response) is None


def test_wrong_or_malformed_answers_score_below_one():
    problem = Problem.from_nd(11, 4)
    assert score("11 - 4 = 7 ; 7 - 4 = 3 ; 3 - 4 < 0 ; # 2", "3", problem) < 1.0
    assert score("11 - 4 = 7 ; 7 - 4 = 3 ; 3 - 4 < 0 ; # 3 ;", "3", problem) < 1.0
    assert score("", "3", problem) == 0.0


def test_partial_credit_grows_with_each_correct_leading_step_and_stays_capped():
    problem = Problem.from_nd(9 * 30 + 5, 9)
    steps = solution_steps(problem)
    rewards = []
    for k in range(len(steps)):
        wrong_tail = "1 - 9 < 0 ; # 1"  # a wrong final step after k correct ones
        response = " ".join([*steps[:k], wrong_tail])
        assert num_correct_leading_steps(response, problem) == k
        rewards.append(score(response, str(problem.answer), problem))
    assert rewards[0] == 0.0
    assert all(a < b for a, b in zip(rewards, rewards[1:], strict=False))
    assert max(rewards) < PARTIAL_CREDIT_MAX < 1.0


def test_without_the_problem_only_the_final_answer_counts():
    assert score("3 - 4 < 0 ; # 3", "3") == 1.0
    assert score("11 - 4 = 7 ; 7 - 4 = 3 ; 3 - 4 < 0 ; # 2", "3") == 0.0


def test_score_rejects_bad_ground_truth_with_a_clear_message():
    with pytest.raises(ValueError, match="integer remainder"):
        score("# 3", "three")
    with pytest.raises(ValueError, match="is not the answer"):
        score("# 3", "2", Problem.from_nd(11, 4))


def test_problem_rejects_inconsistent_fields():
    with pytest.raises(ValueError, match="from_nd"):
        Problem(n=11, d=4, answer=2, num_steps=2)
    with pytest.raises(ValueError, match="d >= 1"):
        Problem.from_nd(11, 0)


def test_longest_possible_response_fits_in_1024_tokens():
    longest = max(response_num_tokens(Problem.from_nd(MAX_STEPS * d + d - 1, d)) for d in range(2, 10))
    assert longest == 947
    assert response_num_tokens(Problem.from_nd(11, 4)) == len("11-4=7;7-4=3;3-4<0;#3") + 1


def test_compact_style_follows_the_documented_format_and_scores_one(problems):
    problem = Problem.from_nd(11, 4)
    assert solution_text(problem, COMPACT) == "11 , 7 , 3 < 4 ; # 3"
    assert len(solution_steps(problem, COMPACT)) == problem.num_steps + 1
    assert response_style(solution_text(problem, COMPACT)) == COMPACT
    assert response_style(solution_text(problem)) == STANDARD
    assert response_style("11 , 7 - 4 = 3 ; # 3") is None  # mixing the styles is not well formed
    for p in problems[:200]:
        compact = solution_text(p, COMPACT)
        assert parse_answer(compact) == p.answer and score(compact, p.answer, p) == 1.0
        assert response_num_tokens(p, COMPACT) < response_num_tokens(p)
    with pytest.raises(ValueError, match="unknown csub solution style"):
        solution_steps(problem, "terse")


def test_partial_credit_follows_whichever_style_the_response_uses():
    problem = Problem.from_nd(20, 3)  # 6 steps + the final one
    compact_prefix = " ".join(solution_steps(problem, COMPACT)[:3]) + " 1 < 3 ; # 1"
    standard_prefix = " ".join(solution_steps(problem)[:3]) + " 1 - 3 < 0 ; # 1"
    assert num_correct_leading_steps(compact_prefix, problem) == 3
    assert num_correct_leading_steps(standard_prefix, problem) == 3
    assert score(compact_prefix, "2", problem) == score(standard_prefix, "2", problem) == PARTIAL_CREDIT_MAX * 3 / 7
