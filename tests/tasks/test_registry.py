import pytest

from verl_tlt.tasks.registry import DEFAULT_TASKS, TASKS, get_task, task_of_data_source


def test_every_task_round_trips_through_its_data_source():
    for name in DEFAULT_TASKS:
        assert task_of_data_source(get_task(name).data_source) == name
        assert TASKS[name].data_source == f"reasoning_gym/{name}"


def test_an_unknown_task_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown task 'sudoku'.*chain_sum"):
        get_task("sudoku")


def test_another_data_source_is_refused_naming_the_command_that_writes_ours():
    with pytest.raises(ValueError, match="'openai/gsm8k'.*verl-tlt tasks write"):
        task_of_data_source("openai/gsm8k")
