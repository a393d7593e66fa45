"""The `verl-tlt` command tree: every command reachable, its help complete, mistakes answered by argparse."""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from verl_tlt.cli import build_parser, leaf_commands, main
from verl_tlt.commands import HelpFormatter

# Every command that runs something; one that disappears (or appears unlisted) fails the tree test.
LEAVES = [
    ("quickstart",),
    ("toy", "build"),
    ("toy", "stats"),
    ("toy", "sft"),
    ("toy", "eval"),
    ("models", "list"),
    ("models", "prepare"),
    ("tasks", "list"),
    ("tasks", "write"),
    ("tasks", "eval"),
    ("drafter", "warmup"),
    ("simulate", "run"),
    ("simulate", "paper"),
    ("simulate", "presets"),
    ("simulate", "calibrate"),
    ("simulate", "replay"),
    ("bench", "engine"),
    ("bench", "verify"),
    ("bench", "sd", "curve"),
    ("bench", "sd", "drafts"),
    ("bench", "sd", "families"),
    ("bench", "sd", "vllm"),
    ("bench", "adaptive"),
    ("bench", "replay"),
    ("bench", "drafter-replay"),
    ("bench", "drafter-train"),
    ("bench", "spot"),
    ("bench", "grpo-memory"),
]
REPO_ROOT = Path(__file__).resolve().parents[1]


def help_text(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_the_tree_holds_exactly_the_known_commands():
    assert [leaf.path for leaf in leaf_commands(build_parser())] == LEAVES


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_command_is_reachable_and_its_help_lists_its_options(path, capsys):
    leaf = {leaf.path: leaf.parser for leaf in leaf_commands(build_parser())}[path]
    assert callable(leaf.get_default("func"))
    text = help_text(list(path), capsys)
    assert text.startswith(f"usage: verl-tlt {' '.join(path)} ")
    options = [option for action in leaf._actions for option in action.option_strings]
    assert len(options) > 1 and all(option in text for option in options)


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_option_has_help_text(path):
    # argparse prints no help line (and so no default) for an option without help text.
    leaf = {leaf.path: leaf.parser for leaf in leaf_commands(build_parser())}[path]
    assert [action.option_strings for action in leaf._actions if not action.help] == []


def test_the_top_level_help_names_every_command(capsys):
    text = help_text([], capsys)
    for path in LEAVES:
        assert f"verl-tlt {' '.join(path)} " in text


def test_the_bench_help_names_every_benchmark(capsys):
    text = help_text(["bench"], capsys)
    for name in {path[1] for path in LEAVES if path[0] == "bench"}:
        assert f"    {name}" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nope"], "argument COMMAND: invalid choice: 'nope'"),
        (["bench", "nope"], "argument COMMAND: invalid choice: 'nope'"),
        (["bench"], "the following arguments are required: COMMAND"),
        ([], "the following arguments are required: COMMAND"),
        (["toy", "stats", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_mistakes_fail_with_argparses_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_refused_option_value_is_a_usage_error_of_its_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "sd", "curve", "--toy-shape", "huge"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "verl-tlt bench sd curve: error: --toy-shape must be one of" in err and "got 'huge'" in err


def test_a_modules_main_runs_its_commands_like_the_whole_tree(capsys):
    from verl_tlt.toy.cli import main as toy_main

    assert main(["toy", "stats", "--num", "20", "--seed", "3"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert toy_main(["stats", "--num", "20", "--seed", "3"]) == 0
    assert json.loads(capsys.readouterr().out) == whole and whole


def test_main_shows_info_lines_of_the_library(monkeypatch, capsys):
    # pytest attaches its own handlers to the root logger; without any, main must add one at INFO.
    monkeypatch.setattr(logging.root, "handlers", [])
    monkeypatch.setattr(logging.root, "level", logging.WARNING)
    assert main(["toy", "stats", "--num", "5"]) == 0
    logging.getLogger("verl_tlt.progress").info("a progress line")
    assert logging.root.level == logging.INFO and len(logging.root.handlers) == 1
    assert "INFO verl_tlt.progress: a progress line" in capsys.readouterr().err


def test_the_help_shows_defaults_worth_showing():
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps")
    parser.add_argument("--out", help="where to write")
    parser.add_argument("--fast", action="store_true", help="skip the slow part")
    parser.add_argument("--cache", default="~/x", help="cache root (default: $CACHE)")
    text = " ".join(parser.format_help().split())
    assert "optimizer steps (default: 400)" in text
    assert "where to write (default" not in text and "skip the slow part (default" not in text
    assert text.count("default") == 2  # the --steps default, and the one --cache's help already names


def test_the_module_entry_point_runs_as_a_script():
    # recipes/quickstart_cpu.sh calls `python -m verl_tlt.cli`.
    result = subprocess.run(
        [sys.executable, "-m", "verl_tlt.cli", "bench", "--help"], capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert result.returncode == 0 and "drafter-replay" in result.stdout
