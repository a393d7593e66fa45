"""with_torch_threads: a thread started for torch work runs with the count its starter asked for."""

from __future__ import annotations

import threading

import pytest
import torch

from tests.openmp_probe import openmp_max_threads_probe
from verl_tlt.modeling.torch_threads import with_torch_threads


@pytest.fixture()
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def run_in_thread(target) -> list:
    seen = []
    thread = threading.Thread(target=lambda: seen.append(target()))
    thread.start()
    thread.join()
    return seen


def test_a_plain_new_thread_ignores_the_starters_count(one_thread):
    """The problem being solved: without the wrapper a new thread gets the process default, not 1."""
    probe = openmp_max_threads_probe()
    if probe() != 1:
        pytest.skip("set_num_threads did not reach the main thread's OpenMP team here")
    default = run_in_thread(probe)[0]
    if default == 1:
        pytest.skip("this process's OpenMP default is one thread (OMP_NUM_THREADS=1?), nothing to tell apart")
    assert default > 1


def test_the_wrapped_thread_runs_with_the_starters_count(one_thread):
    probe = openmp_max_threads_probe()
    assert run_in_thread(with_torch_threads(probe)) == [1]


def test_an_explicit_count_wins(one_thread):
    probe = openmp_max_threads_probe()
    assert run_in_thread(with_torch_threads(probe, 2)) == [2]


def test_arguments_and_result_pass_through():
    assert with_torch_threads(lambda a, b=0: a + b, 1)(2, b=3) == 5


def test_a_count_below_one_is_refused():
    with pytest.raises(ValueError, match="num_threads must be >= 1, got 0"):
        with_torch_threads(print, 0)
