"""`verl-tlt drafter warmup`: train an EAGLE drafter offline on a target's own answers."""

from __future__ import annotations

import argparse
import json

from verl_tlt.commands import add_command, add_group, options, run_alone, usage_error
from verl_tlt.warmup.recipe import WARMUP_GRAD_CLIP_NORM, WARMUP_LR

# A warm-up that fits a coffee break: SmolLM2-135M's default warm-up on 2 CPU cores ends within it
# (docs/benchmarks.md); a run stopped by it resumes when run again.
DEFAULT_BUDGET_MINUTES = 20.0


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
    warmup.add_argument(
        "--steps", dest="num_steps", type=int, default=1000, help="optimizer steps in all, a resumed run's included"
    )
    warmup.add_argument(
        "--seconds", dest="max_seconds", type=float, default=None, help="stop training after this many seconds"
    )
    warmup.add_argument(
        "--budget-minutes",
        type=float,
        default=DEFAULT_BUDGET_MINUTES,
        help="this run's time budget, collection included: training stops there with a checkpoint and an export "
        "(run the command again to continue); 0 = no budget",
    )
    warmup.add_argument(
        "--fresh",
        action="store_true",
        help="start training from scratch instead of resuming from <out>.warmup-state (collected answers are still "
        "reused from the cache)",
    )
    warmup.add_argument("--temperature", type=float, nargs="+", default=[1.0], help="one or more sampling temperatures")
    warmup.add_argument("--max-tokens", type=int, default=512, help="cap on each answer's tokens")
    warmup.add_argument("--init-from", default=None, help="start from an exported drafter instead of the target")
    warmup.add_argument(
        "--family",
        choices=("eagle", "eagle3"),
        default="eagle",
        help="drafter family (tlt.drafter.family): eagle = EAGLE-1/2, eagle3 = EAGLE-3 (three fused target layers, "
        "its own head over the draft vocabulary; vLLM serves it as method eagle3)",
    )
    warmup.add_argument(
        "--train-depth",
        type=int,
        default=0,
        help="train on the drafter's own chain to this depth (tlt.drafter.train_depth; 1 = target features "
        "only, 0 = the family's recipe: 1 for eagle, 3 for eagle3); deeper drafts of a chain improve, each step "
        "costs about one more forward-backward per depth",
    )
    warmup.add_argument(
        "--lr",
        type=float,
        default=WARMUP_LR,
        help="AdamW learning rate (tlt.drafter.lr online is 3e-4: the warm-up starts further from its goal)",
    )
    warmup.add_argument(
        "--grad-clip-norm", type=float, default=WARMUP_GRAD_CLIP_NORM, help="global gradient-norm clip per step"
    )
    warmup.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: generation and training in fp32 on the host; cuda: the target answers in bf16 on the GPU and the "
        "drafter trains there (fp32 masters, bf16 autocast) against the target's embedding and head alone",
    )
    warmup.add_argument("--seed", type=int, default=0, help="seed of sampling and training")
    warmup.add_argument("--json", default=None, help="write the report here")


# The recipe options, by the tlt.drafter key a refused value is named by.
_RECIPE_FLAGS = {"lr": "--lr", "grad_clip_norm": "--grad-clip-norm", "train_depth": "--train-depth"}


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
        config = DrafterConfig(
            family=args.family, train_depth=args.train_depth, lr=args.lr, grad_clip_norm=args.grad_clip_norm
        )
    except ValueError as error:
        named = (flag for key, flag in _RECIPE_FLAGS.items() if f"drafter.{key} " in str(error))
        flag = next(named, "--train-depth")
        usage_error(args, f"{flag} {getattr(args, flag.removeprefix('--').replace('-', '_'))}: {error}")

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            usage_error(args, "--device cuda: this torch sees no CUDA device; run on a GPU machine or use --device cpu")
    try:
        target = str(resolve_model(args.target))
    except MODEL_ERRORS as error:
        usage_error(args, f"--target: {error}")
    prompts = prompts_from_parquet(args.prompts, target, args.prompt_key, args.num_prompts)
    if args.budget_minutes < 0:
        usage_error(args, f"--budget-minutes must be >= 0 (0 = no budget), got {args.budget_minutes}")
    settings = options(args, "num_steps", "max_seconds", "temperature", "max_tokens", "seed", "init_from", "device")
    budget = args.budget_minutes * 60 or None
    report = warmup_drafter(
        target, prompts, args.out, config=config, budget_seconds=budget, resume=not args.fresh, **settings
    )
    print(json.dumps(asdict(report), indent=2))
    if args.json:
        write_json(args.json, asdict(report))
    return 0
