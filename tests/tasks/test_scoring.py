import pytest

from verl_tlt.tasks.problems import generate
from verl_tlt.tasks.scoring import score_response

pytest.importorskip("reasoning_gym")


@pytest.mark.parametrize("task", ["chain_sum", "basic_arithmetic", "gsm_symbolic"])
def test_the_right_answer_scores_one_and_a_wrong_one_zero(task):
    problem = generate(task, 11, 4)[1]
    score = lambda response: score_response(task, 11, 4, 1, response, problem.answer)  # noqa: E731
    assert score(f"Step by step... <answer>{problem.answer}</answer>") == 1.0
    wrong = str(int(float(problem.answer)) + 1)
    # gsm_symbolic's own scorer gives a wrong number 0.01: the reward is binary, so that is 0.0 here.
    assert score(f"<answer>{wrong}</answer>") == 0.0
    assert score("I cannot solve this.") == 0.0


def test_a_row_whose_problem_regenerates_with_another_answer_is_refused():
    problem = generate("chain_sum", 11, 4)[0]
    with pytest.raises(ValueError, match="not the row's ground truth '999999'.*verl-tlt tasks write"):
        score_response("chain_sum", 11, 4, 0, f"<answer>{problem.answer}</answer>", "999999")
