"""`verl-tlt bench <name>`: benchmarks that print ratios measured in one run."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verl-tlt bench")
    sub = parser.add_subparsers(dest="name", required=True)
    engine = sub.add_parser("engine", help="torch engine vs transformers generate (tokens/s)")
    engine.add_argument("--json", help="write results to this path")
    engine.add_argument("--models", nargs="+", default=["toy-1m", "qwen2-50m"])
    engine.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16])
    engine.add_argument("--prompt-len", type=int, default=32)
    engine.add_argument("--new-tokens", type=int, default=64)
    engine.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.name == "engine":
        from verl_tlt.bench.engine_bench import MODELS, run

        unknown = sorted(set(args.models) - set(MODELS))
        if unknown:
            parser.error(f"unknown model(s) {unknown}; choose from {sorted(MODELS)}")
        run(args.json, args.models, args.batch_sizes, args.prompt_len, args.new_tokens, args.repeats)
    return 0
