"""`verl-tlt quickstart`: the same verl GRPO run on the toy world (or, with --model, a real model on reasoning-gym
tasks) without TLT, with TLT, with TLT but a frozen drafter, and without TLT again (the control), then a comparison.

`recipes/quickstart_cpu.sh` runs this after setting up the virtualenv.
- The actor starts from an SFT toy target that writes both solution styles of the task (standard, and 10% of
  its SFT data compact) and the reward prefers the compact one (`toy.reward.compute_score_concise`), so RL moves
  the policy towards a style the drafter rarely saw: the policy drifts, as a reasoning model's does in RL.
- The drafter starts from a warm-up on the initial target's own answers (`verl-tlt drafter warmup`, cached).
- Two rollout replicas of one CPU core each, so a replica that drains frees a core for spot training.
- Every run samples each response from a seed of its slot, so all runs sample the same responses as long as their
  weights are bitwise equal; the report checks this per step (weight checksums, response contents) and flags any
  step where equal weights gave different responses.
Writes `<out>/summary.json` (per-step rows of every run, the headline ratios, the identity claim, stage timings)
and `<out>/comparison.png`; target and drafter are trained once (a few CPU minutes) and cached. Exits with 1 if
the identity claim is violated.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
from dataclasses import fields, replace
from pathlib import Path

from verl_tlt.commands import add_command, positive_int, run_alone, usage_error
from verl_tlt.files import write_json
from verl_tlt.quickstart.recipe import COMPARED, GROUP_DRAFTS, RUNS, TOY, GRPOSettings, settings_for
from verl_tlt.quickstart.report import format_report

logger = logging.getLogger(__name__)

DESCRIPTION = (
    "verl GRPO on CPU (the toy world, or a real model with --model) without TLT, with TLT, with a frozen drafter and "
    "without TLT again (the control); compares speed, acceptance and whether every run sampled the baseline's "
    "responses"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="outputs/quickstart", help="output directory (summary.json, plot, logs)")
    parser.add_argument(
        "--cache",
        default=None,
        help="where the toy world, target and drafter are built and reused (default: $VERL_TLT_CACHE, else "
        "~/.cache/verl-tlt)",
    )
    parser.add_argument(
        "--model",
        default=TOY,
        help="toy (the fast default: the toy world and its target) or a real model of `verl-tlt models list`, trained "
        "on reasoning-gym tasks (prepared, and its drafter warmed up on its own answers, on first use: tens of "
        "minutes on 2 cores)",
    )
    # The toy's drift (compact share 5% -> ~90%) is complete by about step 8 at lr 5e-4; the steps after it show
    # whether the online drafter catches up with the drifted policy while the frozen one stays behind.
    toy, real = settings_for(TOY), settings_for("real")

    def sized(flag: str, kind, key: str, what: str) -> None:
        parser.add_argument(
            flag,
            type=kind,
            default=None,
            help=f"{what} (default: {getattr(toy, key)} for the toy, {getattr(real, key)} for a real model)",
        )

    sized("--steps", positive_int, "steps", "GRPO steps per run")
    sized("--batch-size", positive_int, "batch_size", "prompts per step")
    sized("--group-size", positive_int, "group_size", "GRPO samples per prompt (rollout.n)")
    sized("--max-response-length", positive_int, "max_response_length", "data.max_response_length")
    sized("--lr", float, "lr", "the actor's learning rate")
    parser.add_argument(
        "--replicas", type=positive_int, default=toy.replicas, help="rollout replicas (one CPU core each)"
    )
    parser.add_argument(
        "--rollout",
        choices=["torch", "vllm"],
        default=toy.rollout,
        help="the rollout engine: verl-tlt's torch engine, or verl's vLLM rollout on vLLM's CPU build (needs the vLLM "
        "environment: recipes/quickstart_cpu.sh --rollout vllm sets it up and uses it)",
    )
    parser.add_argument(
        "--family",
        choices=["eagle", "eagle3"],
        default="eagle",
        help="the drafter family TLT trains (tlt.drafter.family): eagle (EAGLE-1/2) or eagle3 (EAGLE-3; on the toy, "
        "its drafter is warmed up on first use, a few minutes)",
    )
    parser.add_argument(
        "--drafter",
        choices=["warmup", "target"],
        default="warmup",
        help="where TLT's drafter starts: warmup (warmed up on the target's own answers, built once and cached) or "
        "target (tlt.drafter.init=target, what a user gets without a warm-up: the drafter starts from the "
        "target's last layer and nothing is built)",
    )
    parser.add_argument("--timeout", type=float, default=1200, help="hard limit per verl job, seconds")
    parser.add_argument("--no-plot", action="store_true", help="skip comparison.png (no matplotlib needed)")
    parser.add_argument(
        "--runs",
        nargs="+",
        choices=list(RUNS),
        default=None,
        help=f"which runs to make (default: all, but {GROUP_DRAFTS} only on the torch rollout; the comparison needs "
        f"{', '.join(COMPARED)}, group drafts {GROUP_DRAFTS} and tlt, the control baseline_repeat; fewer are for "
        "experiments)",
    )
    parser.add_argument(
        "--override",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="extra verl/tlt overrides for every run, after the quickstart's own (e.g. tlt.drafter.lr=3e-3)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `quickstart` to the `verl-tlt` command tree."""
    add_arguments(add_command(subparsers, "quickstart", run, DESCRIPTION))


def run(args: argparse.Namespace) -> int:
    """Run the quickstart for parsed arguments; print the report; 1 if the identity claim is violated."""
    from verl_tlt.quickstart.runner import run_comparison
    from verl_tlt.toy.cache import default_cache_root

    logging.basicConfig(level=logging.INFO, format="%(asctime)s [quickstart] %(message)s", datefmt="%H:%M:%S")
    if args.rollout == "vllm" and importlib.util.find_spec("vllm") is None:
        usage_error(
            args,
            "--rollout vllm needs vLLM's CPU build in this environment: run recipes/quickstart_cpu.sh --rollout vllm, "
            "which sets up .venv-vllm (scripts/setup_vllm_env.sh) and runs the quickstart there",
        )
    runs = args.runs if args.runs is not None else default_runs(args.rollout)
    if args.rollout == "vllm" and GROUP_DRAFTS in runs:
        usage_error(args, f"--runs {GROUP_DRAFTS}: group drafts run on the torch rollout only; drop it or --rollout")
    if args.model != TOY:
        from verl_tlt.models.registry import REAL_MODELS

        if args.model not in REAL_MODELS:
            usage_error(args, f"--model must be {TOY} or one of {', '.join(REAL_MODELS)}, got {args.model!r}")
    if args.family != "eagle" and args.model != TOY:
        usage_error(
            args,
            f"--family {args.family} runs with --model {TOY}: a real model's EAGLE-3 drafter takes hours to warm up on "
            f"CPU. Warm one up (verl-tlt drafter warmup --family {args.family} ...) and pass it with --override "
            f"tlt.drafter.family={args.family} tlt.drafter.init=<its folder>",
        )
    chosen = {f.name: getattr(args, f.name) for f in fields(GRPOSettings) if getattr(args, f.name) is not None}
    out = Path(args.out).resolve()  # verl runs in each run's folder: every path it is given must be absolute
    summary = run_comparison(
        Path(args.cache) if args.cache else default_cache_root(),
        out,
        runs=runs,
        settings=replace(settings_for(args.model), **chosen),
        timeout_s=args.timeout,
        extra=args.override,
        model=args.model,
        family=args.family,
        warm_drafter=args.drafter == "warmup",
    )
    write_json(out / "summary.json", summary)
    print(format_report(summary))
    if not args.no_plot and all(name in summary["runs"] for name in COMPARED):
        from verl_tlt.quickstart.plot import plot_comparison

        print(f"plot: {plot_comparison(summary['runs'], out / 'comparison.png')}")
    print(f"summary: {out / 'summary.json'}")
    violators = [name for name, claim in summary["identity"].items() if claim["violations"]]
    if violators:
        logger.error("identity violated in %s: different responses from bitwise-equal weights (see above)", violators)
        return 1
    return 0


def default_runs(rollout: str) -> list[str]:
    """Every run, in order; on vLLM without the group-drafts run (group drafts are the torch rollout's)."""
    return [name for name in RUNS if rollout == "torch" or name != GROUP_DRAFTS]


def main(argv: list[str] | None = None) -> int:
    return run_alone(register, "quickstart", argv)
