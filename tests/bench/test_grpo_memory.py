"""`verl-tlt bench grpo-memory`: its options are checked before any job starts, and the runs differ only in TLT."""

from __future__ import annotations

import pytest

from verl_tlt.bench.grpo_memory_bench import RUNS


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "gpt2"], "invalid choice: 'gpt2'"),
        (["--drafter", "/nonexistent/drafter"], "--drafter /nonexistent/drafter: no drafter there"),
        (["--batch-size", "3", "--group-size", "3"], "do not split over --replicas 2"),
        (["--steps", "0"], "must be >= 1"),
    ],
)
def test_bad_options_are_usage_errors(argv, message, capsys):
    from verl_tlt.cli import main

    with pytest.raises(SystemExit) as excinfo:
        main(["bench", "grpo-memory", *argv])
    assert excinfo.value.code == 2
    assert message in capsys.readouterr().err


def test_tlt_off_runs_first_and_the_runs_differ_only_in_the_tlt_block():
    assert list(RUNS) == ["tlt_off", "tlt_on"]
    assert all(override.startswith("tlt.") for overrides in RUNS.values() for override in overrides)
