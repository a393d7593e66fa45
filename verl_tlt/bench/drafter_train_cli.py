"""`verl-tlt bench drafter-train`: the drafter trainer's cost per step, dense recipe against the new one."""

from __future__ import annotations

import argparse

from verl_tlt.commands import add_command, positive_int, usage_error


def add_drafter_train(bench: argparse._SubParsersAction) -> None:
    from verl_tlt.bench.drafter_train_bench import DEFAULT_SHAPES, SHAPES

    about = "drafter training tokens/s, step time and peak memory: dense recipe vs sparse labels and draft vocabulary"
    train = add_command(bench, "drafter-train", _run, about)
    train.add_argument("--json", help="write results to this path")
    train.add_argument(
        "--shapes", nargs="+", default=list(DEFAULT_SHAPES), help=f"target shapes, from {', '.join(SHAPES)}"
    )
    train.add_argument(
        "--tokens",
        type=positive_int,
        default=None,
        help="trained pairs per step (default: 4096, tlt.drafter.max_tokens_per_batch's default; 256 for "
        "qwen2.5-7b on a CPU)",
    )
    train.add_argument("--rounds", type=positive_int, default=3, help="timed steps per recipe, after one untimed")
    train.add_argument("--device", default="cpu", help="torch device (e.g. cuda)")


def _run(args: argparse.Namespace) -> int:
    from verl_tlt.bench.drafter_train_bench import SHAPES, run

    unknown = [shape for shape in args.shapes if shape not in SHAPES]
    if unknown:
        usage_error(args, f"--shapes: unknown {unknown}; choose from {', '.join(SHAPES)}")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            usage_error(args, f"--device {args.device}: no CUDA device here; leave --device out to measure on the CPU")
    run(args.json, args.shapes, args.tokens, args.rounds, device=args.device)
    return 0
