"""`verl-tlt` command line: quickstart, toy world, real models and tasks, drafter warm-up, simulator, benchmarks.

The tree is built from each command module's `register(subparsers)`; `verl-tlt --help` lists every command down to
the leaves, and `verl-tlt <command> ... --help` shows a leaf's options.
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from typing import NamedTuple

from verl_tlt.bench import cli as bench_cli
from verl_tlt.models import cli as models_cli
from verl_tlt.quickstart import cli as quickstart_cli
from verl_tlt.sim import cli as sim_cli
from verl_tlt.tasks import cli as tasks_cli
from verl_tlt.toy import cli as toy_cli
from verl_tlt.warmup import cli as warmup_cli

# In the order `verl-tlt --help` lists them: the quickstart first, the benchmarks last.
COMMAND_MODULES = (quickstart_cli, toy_cli, models_cli, tasks_cli, warmup_cli, sim_cli, bench_cli)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_INDEX_WIDTH = 100


def build_parser() -> argparse.ArgumentParser:
    """The whole `verl-tlt` command tree, with an index of every leaf command in the top-level help."""
    parser = argparse.ArgumentParser(
        prog="verl-tlt",
        description="verl-tlt: TLT (Taming the Long-Tail) for verl, its toy world, drafter warm-up and benchmarks.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, title="commands")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    parser.epilog = command_index(parser)
    return parser


class Leaf(NamedTuple):
    """A command that runs something: its words after `verl-tlt`, its parser and its one-line help."""

    path: tuple[str, ...]
    parser: argparse.ArgumentParser
    summary: str


def leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = (), summary: str = "") -> list[Leaf]:
    """Every command under `parser` that runs something, depth first in registration order."""
    # argparse keeps a parser's subcommands, and their one-line help, only in private attributes; read, never changed.
    groups = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not groups:
        return [Leaf(path, parser, summary)]
    leaves = []
    for group in groups:
        summaries = {choice.dest: choice.help or "" for choice in group._choices_actions}
        for name, child in group.choices.items():
            leaves += leaf_commands(child, (*path, name), summaries.get(name, ""))
    return leaves


def command_index(parser: argparse.ArgumentParser) -> str:
    """Every leaf command with its one-line help, for the end of `verl-tlt --help`."""
    names = [f"  {parser.prog} {' '.join(leaf.path)}" for leaf in leaf_commands(parser)]
    width = max(len(name) for name in names) + 2
    lines = [f"every command (`{parser.prog} COMMAND ... --help` shows its options):"]
    for name, leaf in zip(names, leaf_commands(parser), strict=True):
        wrapped = textwrap.wrap(leaf.summary, max(_INDEX_WIDTH - width, 40)) or [""]
        lines.append(f"{name:<{width}}{wrapped[0]}")
        lines += [" " * width + more for more in wrapped[1:]]
    return "\n".join(lines)


def configure_logging(level: int = logging.INFO) -> None:
    """Show the library's INFO lines (progress of long work, what was built or reused) on stderr, with the time."""
    logging.basicConfig(level=level, format=LOG_FORMAT, datefmt="%H:%M:%S")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
