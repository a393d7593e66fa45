import pytest

from verl_tlt.tasks.problems import entry_of, generate
from verl_tlt.tasks.registry import DEFAULT_TASKS

pytest.importorskip("reasoning_gym")  # a dependency of the package: missing only in a broken environment


@pytest.mark.parametrize("task", DEFAULT_TASKS)
def test_problems_are_reproducible_from_their_seed_and_differ_across_seeds(task):
    first, again, other = generate(task, 5, 8), generate(task, 5, 8), generate(task, 6, 8)
    assert first == again
    assert [p.question for p in first] != [p.question for p in other]
    assert all(p.task == task and p.seed == 5 and p.size == 8 for p in first)
    assert [p.index for p in first] == list(range(8))


def test_an_entry_is_found_again_by_seed_size_and_index():
    problems = generate("chain_sum", 3, 4)
    _, entry = entry_of("chain_sum", 3, 4, 2)
    assert entry["question"] == problems[2].question and str(entry["answer"]) == problems[2].answer


def test_bad_sizes_and_indices_are_refused():
    with pytest.raises(ValueError, match="at least one problem"):
        generate("chain_sum", 0, 0)
    with pytest.raises(ValueError, match="index 4 is outside the chain_sum dataset of size 4"):
        entry_of("chain_sum", 3, 4, 4)
