"""`verl-tlt bench grpo-memory`: each component's peak memory in a verl GRPO job on a real model, TLT off and on."""

from __future__ import annotations

import argparse
from pathlib import Path

from verl_tlt.commands import add_command, positive_int, usage_error
from verl_tlt.models.registry import REAL_MODELS


def add_grpo_memory(bench: argparse._SubParsersAction) -> None:
    from verl_tlt.bench.grpo_memory_bench import MemoryJob

    default = MemoryJob()
    about = "peak memory per component (driver, verl workers, rollout servers, drafter workers) of GRPO, TLT off vs on"
    memory = add_command(bench, "grpo-memory", _run, about)
    memory.add_argument("--json", help="write results to this path")
    memory.add_argument(
        "--model", default=default.model, choices=list(REAL_MODELS), help="a real model (prepared first)"
    )
    memory.add_argument("--steps", type=positive_int, default=default.steps, help="GRPO steps per run")
    memory.add_argument("--batch-size", type=positive_int, default=default.batch_size, help="prompts per step")
    memory.add_argument("--group-size", type=positive_int, default=default.group_size, help="samples per prompt")
    memory.add_argument(
        "--max-response-length", type=positive_int, default=default.max_response_length, help="response token cap"
    )
    memory.add_argument("--replicas", type=positive_int, default=default.replicas, help="trainer workers = replicas")
    memory.add_argument(
        "--drafter", default=default.drafter, help="tlt.drafter.init: 'target' or a warmed-up drafter's folder"
    )
    memory.add_argument(
        "--timeout-minutes", type=positive_int, default=int(default.timeout_s // 60), help="per run; then killed"
    )
    memory.add_argument("--out", default="outputs/grpo_memory", help="where each run's log, metrics and data go")


def _run(args: argparse.Namespace) -> int:
    from verl_tlt.bench.grpo_memory_bench import MemoryJob, run

    if args.drafter != "target" and not (Path(args.drafter) / "config.json").is_file():
        usage_error(
            args, f"--drafter {args.drafter}: no drafter there (no config.json); give an export folder or 'target'"
        )
    if (args.batch_size * args.group_size) % args.replicas:
        usage_error(
            args,
            f"--batch-size {args.batch_size} x --group-size {args.group_size} samples do not split over "
            f"--replicas {args.replicas}; make the product a multiple of it",
        )
    job = MemoryJob(
        model=args.model,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_response_length=args.max_response_length,
        replicas=args.replicas,
        drafter=str(Path(args.drafter).resolve()) if args.drafter != "target" else "target",
        timeout_s=60.0 * args.timeout_minutes,
    )
    report = run(args.json, job, args.out)
    return 0 if all(outcome["returncode"] == 0 for outcome in report["runs"].values()) else 1
