"""`verl-tlt toy build|stats|sft|eval`: build the toy world, print its length distribution, train or evaluate
the SFT toy target."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    if args.action == "build":
        from verl_tlt.toy.build import build_toy_world

        world = build_toy_world(args.out, seed=args.seed, num_train=args.num_train, num_val=args.num_val)
        print(json.dumps({k: str(v) for k, v in world.__dict__.items()}, indent=2))
    elif args.action == "stats":
        from verl_tlt.toy.task import length_stats, make_problems

        print(json.dumps(length_stats(make_problems(args.num, seed=args.seed)), indent=2))
    elif args.action == "sft":
        _sft(args)
    else:
        _report(args.path, args)
    return 0


def _parser() -> argparse.ArgumentParser:
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
    sft = sub.add_parser(
        "sft",
        help="SFT the toy target and print its evaluation; without --out, train (or reuse) the cached target",
    )
    sft.add_argument("--out", help="train into this new directory instead of the cache")
    sft.add_argument("--cache", help="cache root (default: $VERL_TLT_CACHE or ~/.cache/verl-tlt)")
    sft.add_argument("--seed", type=int, default=0)
    sft.add_argument("--steps", type=int, help="optimizer steps (default: the cached target's)")
    sft.add_argument("--threads", type=int, help="torch threads while training (default: torch's choice)")
    _add_eval_arguments(sft)
    evaluate = sub.add_parser("eval", help="evaluate a toy target checkpoint (accuracy by length, entropy)")
    evaluate.add_argument("path")
    _add_eval_arguments(evaluate)
    return parser


def _add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-problems", type=int, default=500, help="evaluation problems")
    parser.add_argument("--eval-seed", type=int, help="evaluation problem seed (default: a fixed held-out one)")
    parser.add_argument("--max-new-tokens", type=int, help="cap on response tokens (default: 2x the reference + 16)")
    parser.add_argument("--json", help="also write the evaluation report to this JSON file")


def _sft(args: argparse.Namespace) -> None:
    from verl_tlt.toy.sft import DEFAULT_NUM_STEPS, ensure_toy_target, train_toy_target

    steps = DEFAULT_NUM_STEPS if args.steps is None else args.steps
    if args.out is not None:
        path = train_toy_target(args.out, seed=args.seed, num_steps=steps, num_threads=args.threads)
    else:
        if args.threads is not None:
            import torch

            torch.set_num_threads(args.threads)
        path = ensure_toy_target(args.cache, seed=args.seed, num_steps=steps)
    _report(path, args)


def _report(path: str | Path, args: argparse.Namespace) -> dict[str, Any]:
    from verl_tlt.files import write_json
    from verl_tlt.toy.sft import DEFAULT_EVAL_SEED, evaluate_toy_target, format_report, read_training_info

    seed = DEFAULT_EVAL_SEED if args.eval_seed is None else args.eval_seed
    report = evaluate_toy_target(path, num_problems=args.num_problems, seed=seed, max_new_tokens=args.max_new_tokens)
    report["training"] = read_training_info(path)
    print(format_report(report))
    if args.json:
        write_json(args.json, report)
        print(f"report written to {args.json}")
    return report
