"""`verl-tlt bench spot`: a drafter worker's spot-training cycle on a device (onload, steps, stop, offload)."""

from __future__ import annotations

import argparse

from verl_tlt.commands import add_command, positive_int, usage_error


def add_spot(bench: argparse._SubParsersAction) -> None:
    from verl_tlt.bench.drafter_train_bench import SHAPES
    from verl_tlt.bench.spot_bench import DEFAULT_EVAL_TOKENS, DEFAULT_TOKENS

    about = "spot training on a device: tokens/s, peak memory, onload/offload, stop latency, score cost, bf16 vs fp32"
    spot = add_command(bench, "spot", _run, about)
    spot.add_argument("--json", help="write results to this path")
    spot.add_argument("--shape", default="toy", choices=list(SHAPES), help="the target's shape (random weights)")
    spot.add_argument("--device", default="cpu", help="the training device (e.g. cuda)")
    spot.add_argument("--tokens", type=positive_int, default=DEFAULT_TOKENS, help="tokens per optimizer step")
    spot.add_argument(
        "--eval-tokens", type=positive_int, default=DEFAULT_EVAL_TOKENS, help="tokens the per-step score runs on"
    )
    spot.add_argument("--depths", nargs="+", type=positive_int, default=[1, 3], help="train depths measured")
    spot.add_argument("--rounds", type=positive_int, default=3, help="timed optimizer steps per depth")


def _run(args: argparse.Namespace) -> int:
    from verl_tlt.bench.spot_bench import run

    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            usage_error(args, f"--device {args.device}: no CUDA device here; leave --device out to measure on the CPU")
    run(
        args.json,
        args.shape,
        device=args.device,
        tokens=args.tokens,
        eval_tokens=args.eval_tokens,
        depths=tuple(args.depths),
        rounds=args.rounds,
    )
    return 0
