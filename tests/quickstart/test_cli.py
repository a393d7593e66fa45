"""`verl-tlt quickstart` in the command tree: its parser, options and defaults."""

from __future__ import annotations

import argparse

import pytest

from verl_tlt.quickstart import cli
from verl_tlt.quickstart.recipe import RUNS


def _tree() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-tlt")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_register_adds_quickstart_with_every_run_including_the_control_by_default():
    args = _tree().parse_args(["quickstart"])
    assert args.func is cli.run
    assert args.runs == list(RUNS) and "baseline_repeat" in args.runs
    assert (args.steps, args.replicas, args.out) == (15, 2, "outputs/quickstart")


def test_options_reach_the_parsed_arguments():
    args = _tree().parse_args(["quickstart", "--steps", "3", "--runs", "baseline", "tlt", "--override", "a=1", "b=2"])
    assert args.steps == 3 and args.runs == ["baseline", "tlt"] and args.override == ["a=1", "b=2"]


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--runs", "fast"]])
def test_bad_options_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit):
        _tree().parse_args(["quickstart", *argv])
    assert "quickstart" in capsys.readouterr().err


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert all(option in out for option in ("--steps", "--runs", "--override", "--cache", "--timeout"))
