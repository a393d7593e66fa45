"""`verl-tlt toy build|stats|sft|eval`: build the toy world, print its length distribution, train or evaluate
the SFT toy target."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from verl_tlt.commands import add_command, add_group, run_alone


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `toy` and its subcommands to the `verl-tlt` command tree."""
    toy = add_group(subparsers, "toy", "the toy world: build it, its length statistics, SFT or evaluate its target")
    build = add_command(toy, "build", _build, "build (or reuse) the toy world: tiny model, tokenizer, parquet, reward")
    build.add_argument("--out", required=True, help="directory of the world")
    build.add_argument("--seed", type=int, default=0, help="seed of the model init and the prompts")
    build.add_argument("--num-train", type=int, default=512, help="training prompts")
    build.add_argument("--num-val", type=int, default=64, help="validation prompts")
    stats = add_command(toy, "stats", _stats, "print step / response-token percentiles of sampled problems")
    stats.add_argument("--num", type=int, default=5000, help="problems sampled")
    stats.add_argument("--seed", type=int, default=0, help="problem seed")
    sft = add_command(
        toy, "sft", _sft, "SFT the toy target and print its evaluation; without --out, train (or reuse) the cached one"
    )
    sft.add_argument("--out", help="train into this new directory instead of the cache")
    sft.add_argument("--cache", help="cache root (default: $VERL_TLT_CACHE or ~/.cache/verl-tlt)")
    sft.add_argument("--seed", type=int, default=0, help="seed of the init and the SFT data")
    sft.add_argument("--steps", type=int, help="optimizer steps (default: the cached target's)")
    sft.add_argument("--threads", type=int, help="torch threads while training (default: torch's choice)")
    _add_eval_arguments(sft)
    evaluate = add_command(toy, "eval", _eval, "evaluate a toy target checkpoint (accuracy by length, entropy)")
    evaluate.add_argument("path", help="the checkpoint directory")
    _add_eval_arguments(evaluate)


def main(argv: list[str] | None = None) -> int:
    """`verl-tlt toy ARGV...`."""
    return run_alone(register, "toy", argv)


def _add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-problems", type=int, default=500, help="evaluation problems")
    parser.add_argument("--eval-seed", type=int, help="evaluation problem seed (default: a fixed held-out one)")
    parser.add_argument("--max-new-tokens", type=int, help="cap on response tokens (default: 2x the reference + 16)")
    parser.add_argument("--json", help="also write the evaluation report to this JSON file")


def _build(args: argparse.Namespace) -> int:
    from verl_tlt.toy.build import build_toy_world

    world = build_toy_world(args.out, seed=args.seed, num_train=args.num_train, num_val=args.num_val)
    print(json.dumps({k: str(v) for k, v in world.__dict__.items()}, indent=2))
    return 0


def _stats(args: argparse.Namespace) -> int:
    from verl_tlt.toy.task import length_stats, make_problems

    print(json.dumps(length_stats(make_problems(args.num, seed=args.seed)), indent=2))
    return 0


def _sft(args: argparse.Namespace) -> int:
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
    return 0


def _eval(args: argparse.Namespace) -> int:
    _report(args.path, args)
    return 0


def _report(path: str | Path, args: argparse.Namespace) -> dict[str, Any]:
    from verl_tlt.files import write_json
    from verl_tlt.toy.evaluate import DEFAULT_EVAL_SEED, evaluate_toy_target, format_report
    from verl_tlt.toy.sft import read_training_info

    seed = DEFAULT_EVAL_SEED if args.eval_seed is None else args.eval_seed
    report = evaluate_toy_target(path, num_problems=args.num_problems, seed=seed, max_new_tokens=args.max_new_tokens)
    report["training"] = read_training_info(path)
    print(format_report(report))
    if args.json:
        write_json(args.json, report)
        print(f"report written to {args.json}")
    return report
