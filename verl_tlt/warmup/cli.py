"""`verl-tlt drafter warmup`: train an EAGLE drafter offline on a target's own answers."""

from __future__ import annotations

import argparse
import json

from verl_tlt.commands import add_command, add_group, options, run_alone, usage_error


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `drafter` and its subcommands to the `verl-tlt` command tree."""
    drafter = add_group(subparsers, "drafter", "the EAGLE drafter: warm it up offline before RL")
    warmup = add_command(
        drafter, "warmup", _warmup, "generate with the target, record hidden states, train a drafter and export it"
    )
    warmup.add_argument(
        "--target", required=True, help="a model `verl-tlt models list` names, or a transformers checkpoint folder"
    )
    warmup.add_argument("--prompts", required=True, help="verl RL parquet with a chat-message prompt column")
    warmup.add_argument("--out", required=True, help="where to write the drafter (EAGLE layout)")
    warmup.add_argument("--prompt-key", default="prompt", help="the parquet's prompt column")
    warmup.add_argument("--num-prompts", type=int, default=256, help="prompts read from the parquet (its first ones)")
    warmup.add_argument("--steps", dest="num_steps", type=int, default=1000, help="optimizer steps (upper bound)")
    warmup.add_argument(
        "--seconds", dest="max_seconds", type=float, default=None, help="stop training after this many seconds"
    )
    warmup.add_argument("--temperature", type=float, nargs="+", default=[1.0], help="one or more sampling temperatures")
    warmup.add_argument("--max-tokens", type=int, default=512, help="cap on each answer's tokens")
    warmup.add_argument("--init-from", default=None, help="start from an exported drafter instead of the target")
    warmup.add_argument(
        "--train-depth",
        type=int,
        default=1,
        help="train on the drafter's own chain to this depth (tlt.drafter.train_depth; 1 = target features "
        "only); deeper drafts of a chain improve, each step costs about one more forward-backward per depth",
    )
    warmup.add_argument("--seed", type=int, default=0, help="seed of sampling and training")
    warmup.add_argument("--json", default=None, help="write the report here")


def main(argv: list[str] | None = None) -> int:
    """`verl-tlt drafter ARGV...`."""
    return run_alone(register, "drafter", argv)


def _warmup(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from verl_tlt.config import DrafterConfig
    from verl_tlt.files import write_json
    from verl_tlt.models.prepare import MODEL_ERRORS, resolve_model
    from verl_tlt.warmup.offline import prompts_from_parquet, warmup_drafter

    try:
        config = DrafterConfig(train_depth=args.train_depth)
    except ValueError as error:
        usage_error(args, f"--train-depth {args.train_depth}: {error}")

    try:
        target = str(resolve_model(args.target))
    except MODEL_ERRORS as error:
        usage_error(args, f"--target: {error}")
    prompts = prompts_from_parquet(args.prompts, target, args.prompt_key, args.num_prompts)
    settings = options(args, "num_steps", "max_seconds", "temperature", "max_tokens", "seed", "init_from")
    report = warmup_drafter(target, prompts, args.out, config=config, **settings)
    print(json.dumps(asdict(report), indent=2))
    if args.json:
        write_json(args.json, asdict(report))
    return 0
