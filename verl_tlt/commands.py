"""Command-line plumbing shared by the command modules (quickstart, toy world, drafter warm-up, benchmarks).

Each command module exposes `register(subparsers)`, which adds its commands with `add_command` (a leaf: options and
the function that runs it) or `add_group` (a command with subcommands). `verl_tlt.cli` builds the whole `verl-tlt`
tree from these; `run_alone` runs one module's commands without the rest (the modules' `main(argv)`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

Run = Callable[[argparse.Namespace], int]
Register = Callable[["argparse._SubParsersAction"], None]


class HelpFormatter(argparse.HelpFormatter):
    """Help that ends each option's help text with its default, where there is one worth showing.

    No default is shown for flags (False), for options without one (None, empty list), or where the help text
    already says what happens by default. (argparse prints no line for an option without help text: give each one.)
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text, default = action.help, action.default
        if not text or text is argparse.SUPPRESS or not action.option_strings or "default" in text:
            return text
        if default is None or default is False or default is argparse.SUPPRESS or default == []:
            return text
        return f"{text} (default: %(default)s)"


def add_command(
    subparsers: argparse._SubParsersAction, name: str, run: Run, help: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A leaf command: `run(args) -> exit code` runs it; `usage_error(args, ...)` reports a bad option from it."""
    parser = subparsers.add_parser(name, help=help, description=description or help, formatter_class=HelpFormatter)
    parser.set_defaults(func=run, command_parser=parser)
    return parser


def add_group(subparsers: argparse._SubParsersAction, name: str, help: str) -> argparse._SubParsersAction:
    """A command made of subcommands (`verl-tlt toy build`, ...); returns the subparsers to add them to."""
    parser = subparsers.add_parser(name, help=help, description=help)
    return parser.add_subparsers(dest=f"{name}_command", metavar="COMMAND", required=True, title="commands")


def usage_error(args: argparse.Namespace, message: str) -> NoReturn:
    """Exit with argparse's usage message of the command that is running (status 2), as for a bad option."""
    args.command_parser.error(message)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (a bad one is argparse's usage error, naming the option)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def options(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The named parsed options as keyword arguments (each option's `dest` is the callee's parameter name)."""
    return {name: getattr(args, name) for name in names}


def run_alone(register: Register, name: str, argv: list[str] | None = None) -> int:
    """`verl-tlt NAME ARGV...` with only the commands that `register` adds (a module's `main(argv)`)."""
    parser = argparse.ArgumentParser(prog="verl-tlt")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([name, *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
