"""`verl-tlt tasks list|write|eval`: the real reasoning tasks, their verl parquet, and a model's pass rates on them."""

from __future__ import annotations

import argparse
import json
import sys

from verl_tlt.commands import add_command, add_group, positive_int, run_alone


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `tasks` and its subcommands to the `verl-tlt` command tree."""
    from verl_tlt.tasks.registry import DEFAULT_TASKS, TASKS

    tasks = add_group(subparsers, "tasks", "real reasoning tasks (reasoning-gym): list, write as verl parquet, eval")
    add_command(tasks, "list", _list, "the tasks, their reasoning-gym configuration and verl data_source")
    write = add_command(
        tasks,
        "write",
        _write,
        "write train.parquet and val.parquet (chat prompts, seeded) for verl's data.train_files/val_files",
    )
    write.add_argument("--out", required=True, help="output directory")
    write.add_argument("--train", type=positive_int, default=256, help="training problems per task")
    write.add_argument("--val", type=positive_int, default=32, help="validation problems per task")
    evaluate = add_command(
        tasks,
        "eval",
        _eval,
        "a model's greedy and sampled pass rate per task on the validation problems, the share of GRPO groups "
        "whose rewards differ, and response lengths p50/p90/max",
    )
    evaluate.add_argument("--model", default="smollm2-135m", help="a model `verl-tlt models list` names, or a folder")
    evaluate.add_argument("--problems", type=positive_int, default=16, help="validation problems per task")
    evaluate.add_argument("--group-size", type=positive_int, default=4, help="samples per problem (a GRPO group)")
    evaluate.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the group")
    evaluate.add_argument("--max-new-tokens", type=positive_int, default=256, help="response token limit")
    evaluate.add_argument("--json", help="also write the report to this file")
    for command in (write, evaluate):
        command.add_argument(
            "--tasks", nargs="+", choices=sorted(TASKS), default=list(DEFAULT_TASKS), help="tasks (default: all)"
        )
        command.add_argument("--seed", type=int, default=0, help="seed of the problems (val uses its own offset)")


def main(argv: list[str] | None = None) -> int:
    """`verl-tlt tasks ARGV...`."""
    return run_alone(register, "tasks", argv)


def _list(args: argparse.Namespace) -> int:
    from verl_tlt.tasks.registry import TASKS

    for task in TASKS.values():
        print(f"{task.name}: data_source {task.data_source}, reasoning-gym config {task.config_json()}")
    return 0


def _write(args: argparse.Namespace) -> int:
    from verl_tlt.tasks.dataset import write_splits

    paths = write_splits(args.out, args.tasks, args.train, args.val, args.seed)
    print(json.dumps({split: str(path) for split, path in paths.items()}, indent=2))
    return 0


def _eval(args: argparse.Namespace) -> int:
    from verl_tlt.models.prepare import MODEL_ERRORS, resolve_model
    from verl_tlt.tasks.evaluate import evaluate_tasks, format_report

    try:
        path = resolve_model(args.model)
    except MODEL_ERRORS as error:
        print(f"error: --model: {error}", file=sys.stderr)
        return 1
    report = evaluate_tasks(
        path,
        args.tasks,
        num_problems=args.problems,
        group_size=args.group_size,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
    return 0
