"""`verl-tlt` command line: quickstart, toy world, drafter warm-up, benchmarks."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="verl-tlt", description="verl-tlt: TLT for verl")
    parser.add_argument("command", choices=["quickstart", "toy", "bench", "drafter"], help="what to run")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    command, rest = argv[0], argv[1:]
    if command == "quickstart":
        from verl_tlt.quickstart.cli import main as quickstart_main

        return quickstart_main(rest)
    if command == "toy":
        from verl_tlt.toy.cli import main as toy_main

        return toy_main(rest)
    if command == "drafter":
        from verl_tlt.warmup.cli import main as drafter_main

        return drafter_main(rest)
    if command == "bench":
        from verl_tlt.bench.cli import main as bench_main

        return bench_main(rest)
    parser.error(f"unknown command {command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
