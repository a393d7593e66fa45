"""`verl-tlt simulate`: the RL-step simulator's commands.

`simulate replay` checks the event model against a run it can see: each recorded rollout is replayed from its own
requests (arrivals, lengths) and the run's measured step costs, and the predicted rollout times are printed beside
the measured ones.
"""

from __future__ import annotations

import argparse

from verl_tlt.commands import add_command, add_group, positive_int, run_alone, usage_error


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `simulate` and its commands to the `verl-tlt` command tree."""
    simulate = add_group(subparsers, "simulate", "the RL-step simulator: replay recorded rollouts")
    replay = add_command(
        simulate, "replay", _run_replay, "predict each recorded rollout's time from its requests and measured costs"
    )
    replay.add_argument(
        "traces",
        nargs="+",
        help="rollout record files (engine_kwargs.torch.trace_path; the quickstart writes <out>/<run>/"
        "rollout_trace.jsonl)",
    )
    replay.add_argument("--max-num-seqs", type=positive_int, default=256, help="the replicas' max_num_seqs")
    replay.add_argument("--json", help="write the predictions and measurements to this path")


def main(argv: list[str] | None = None) -> int:
    """`verl-tlt simulate ARGV...`."""
    return run_alone(register, "simulate", argv)


def _run_replay(args: argparse.Namespace) -> int:
    from pathlib import Path

    from verl_tlt.files import write_json
    from verl_tlt.sim.calibration import read_rollouts, replay

    missing = [path for path in args.traces if not Path(path).is_file()]
    if missing:
        usage_error(args, f"no such rollout record file: {', '.join(missing)}")
    results = {}
    for path in args.traces:
        try:
            rollouts, costs = read_rollouts(path)
        except ValueError as error:
            usage_error(args, f"{path}: {error}")
        result = replay(rollouts, costs, max_num_seqs=args.max_num_seqs)
        error = result.total_ratio - 1.0
        print(
            f"{path}: {len(rollouts)} rollouts, measured {sum(result.measured_s):.2f} s, predicted "
            f"{sum(result.predicted_s):.2f} s ({100 * error:+.1f}%); prefill step {1000 * result.prefill_step_s:.1f} ms"
        )
        for index, (predicted, measured) in enumerate(zip(result.predicted_s, result.measured_s, strict=True)):
            print(f"  rollout {index + 1:>3}: measured {measured:6.2f} s, predicted {predicted:6.2f} s")
        results[path] = {
            "measured_s": result.measured_s,
            "predicted_s": result.predicted_s,
            "total_ratio": result.total_ratio,
            "prefill_step_s": result.prefill_step_s,
        }
    if args.json:
        write_json(args.json, results)
    return 0
