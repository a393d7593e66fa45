"""`verl-tlt toy build|stats`: build the toy world, or print its length distribution."""

from __future__ import annotations

import argparse
import json
import logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verl-tlt toy")
    sub = parser.add_subparsers(dest="action", required=True)
    build = sub.add_parser("build", help="build (or reuse) the toy world: tiny model, tokenizer, parquet, reward")
    build.add_argument("--out", required=True)
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--num-train", type=int, default=512)
    build.add_argument("--num-val", type=int, default=64)
    stats = sub.add_parser("stats", help="print step / response-token percentiles of sampled problems")
    stats.add_argument("--num", type=int, default=5000)
    stats.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    if args.action == "build":
        from verl_tlt.toy.build import build_toy_world

        world = build_toy_world(args.out, seed=args.seed, num_train=args.num_train, num_val=args.num_val)
        print(json.dumps({k: str(v) for k, v in world.__dict__.items()}, indent=2))
    else:
        from verl_tlt.toy.task import length_stats, make_problems

        print(json.dumps(length_stats(make_problems(args.num, seed=args.seed)), indent=2))
    return 0
