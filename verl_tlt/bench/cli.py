"""`verl-tlt bench <name>`: benchmarks that print ratios measured in one run.

Each benchmark has a function that adds its options (`_add_<name>`) and one that checks them and runs it
(`_run_<name>`); the benchmarks' own modules are imported only when one runs, so `--help` stays quick.
"""

from __future__ import annotations

import argparse

from verl_tlt.bench.drafter_train_cli import add_drafter_train
from verl_tlt.bench.grpo_memory_cli import add_grpo_memory
from verl_tlt.bench.sd_cli import add_model_argument, add_sd, subject_of
from verl_tlt.bench.spot_cli import add_spot
from verl_tlt.commands import add_command, add_group, options, positive_int, run_alone, usage_error


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `bench` and every benchmark to the `verl-tlt` command tree."""
    bench = add_group(subparsers, "bench", "benchmarks: ratios measured in one run, printed and optionally saved")
    for add in (
        _add_engine,
        _add_verify,
        add_sd,
        _add_adaptive,
        _add_replay,
        _add_drafter_replay,
        add_drafter_train,
        add_spot,
        add_grpo_memory,
    ):
        add(bench)


def main(argv: list[str] | None = None) -> int:
    """`verl-tlt bench ARGV...`."""
    return run_alone(register, "bench", argv)


# ----- engine ------------------------------------------------------------------------------------------------


def _add_engine(bench: argparse._SubParsersAction) -> None:
    engine = add_command(bench, "engine", _run_engine, "torch engine vs transformers generate (tokens/s)")
    engine.add_argument("--json", help="write results to this path")
    engine.add_argument("--device", default="cpu", help="torch device for both (e.g. cuda)")
    engine.add_argument(
        "--models",
        nargs="+",
        default=["toy-1m", "qwen2-50m"],
        help="models to measure: random-weight shapes (toy-1m, qwen2-50m) or real ones (smollm2-135m; prepared first)",
    )
    engine.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16], help="requests decoded together")
    engine.add_argument("--prompt-len", type=int, default=32, help="random prompt tokens per request")
    engine.add_argument("--new-tokens", type=int, default=64, help="tokens decoded per request (EOS ignored)")
    engine.add_argument("--repeats", type=int, default=3, help="timed calls per cell, the best kept")
    engine.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32"], help="for both")
    no_compile = "skip the RolloutEngine(compile=True) measurement (compiling takes time)"
    engine.add_argument("--no-compile", action="store_true", help=no_compile)


def _run_engine(args: argparse.Namespace) -> int:
    from verl_tlt.bench.engine_bench import known_models, run

    unknown = sorted(set(args.models) - set(known_models()))
    if unknown:
        usage_error(args, f"unknown model(s) {unknown}; choose from {known_models()}")
    run(
        args.json,
        args.models,
        args.batch_sizes,
        args.prompt_len,
        args.new_tokens,
        args.repeats,
        args.device,
        compile=not args.no_compile,
        dtypes=args.dtypes,
    )
    return 0


# ----- verify ------------------------------------------------------------------------------------------------

# Kept here rather than imported, so that `--help` does not import torch; a test checks them against verify_bench.
VERIFY_MODELS = ["qwen2-150m", "qwen2-tiny", "qwen2.5-7b"]
VERIFY_CPU_MAX_GIB = 8


def _add_verify(bench: argparse._SubParsersAction) -> None:
    about = "target forward cost vs draft tokens verified (k), and SD step overhead"
    verify = add_command(bench, "verify", _run_verify, about)
    verify.add_argument("--json", help="write results to this path")
    model_help = "random-weight Qwen2 shape to measure (qwen2.5-7b: 15 GB in bf16, for --device cuda)"
    verify.add_argument("--model", choices=VERIFY_MODELS, default="qwen2-150m", help=model_help)
    verify.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the target is built and run")
    large_help = f"run a model over {VERIFY_CPU_MAX_GIB} GiB of weights (e.g. qwen2.5-7b) on --device cpu anyway"
    verify.add_argument("--allow-large-cpu", action="store_true", help=large_help)
    batch_sizes = [1, 2, 4, 8, 16, 32]
    verify.add_argument("--batch-sizes", nargs="+", type=int, default=batch_sizes, help="rows verified together")
    ks_help = "draft tokens verified (width k + 1 a row); 0 = a plain decode step (width 1)"
    verify.add_argument("--ks", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64], help=ks_help)
    dtypes, modes = ["float32", "bfloat16"], ["chain", "tree"]
    verify.add_argument("--dtypes", nargs="+", choices=dtypes, default=dtypes, help="model dtypes")
    verify.add_argument("--modes", nargs="+", choices=modes, default=modes, help="draft shapes verified")
    verify.add_argument("--context-len", type=int, default=256, help="tokens in the cache before each verify")
    verify.add_argument("--repeats", type=int, default=3, help="timed calls per cell, the best kept")
    sd_help = "measured speculative steps for the SD overhead (batch 1, first of --dtypes); 0 skips it"
    verify.add_argument("--sd-steps", type=int, default=20, help=sd_help)
    verify.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")


def _run_verify(args: argparse.Namespace) -> int:
    import torch

    from verl_tlt.bench.verify_bench import device_problem
    from verl_tlt.bench.verify_bench import run as run_verify

    if min(args.batch_sizes + [args.context_len, args.repeats]) < 1:
        usage_error(args, "--batch-sizes, --context-len and --repeats must be >= 1")
    if min(args.ks) < 0 or args.sd_steps < 0:
        usage_error(args, f"--ks and --sd-steps must be >= 0, got --ks {args.ks} and --sd-steps {args.sd_steps}")
    if problem := device_problem(args.device, args.model, args.dtypes, args.allow_large_cpu):
        usage_error(args, problem)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    grid = options(args, "model", "batch_sizes", "ks", "dtypes", "modes", "context_len", "repeats")
    run_verify(args.json, **grid, sd_steps=args.sd_steps, device=args.device)
    return 0


# The `tlt.speculative` keys each policy benchmark lets the command line override.
ADAPTIVE_POLICY_KEYS = ("threshold", "strategies", "buckets")
REPLAY_POLICY_KEYS = ("threshold", "strategies", "epsilon", "window", "buckets")


# ----- adaptive ----------------------------------------------------------------------------------------------


def _add_adaptive(bench: argparse._SubParsersAction) -> None:
    adaptive = add_command(
        bench, "adaptive", _run_adaptive, "adaptive policy vs plain and fixed strategies on a long-tail rollout"
    )
    adaptive.add_argument("--json", help="write results to this path")
    add_model_argument(adaptive)
    adaptive.add_argument("--device", default="cpu", help="torch device of target and drafter (e.g. cuda)")
    adaptive.add_argument(
        "--num-requests", type=positive_int, default=256, help="prompts of the rollout, started together"
    )
    adaptive.add_argument(
        "--max-tokens",
        type=positive_int,
        default=1024,
        help="response cap (the toy world's longest solution is 937 tokens)",
    )
    adaptive.add_argument("--repeats", type=positive_int, default=3, help="timed runs per variant, the best kept")
    adaptive.add_argument("--cuda-graphs", action="store_true", help="RolloutEngine(cuda_graphs=True) (CUDA only)")
    _add_policy_overrides(adaptive, ADAPTIVE_POLICY_KEYS)


def _run_adaptive(args: argparse.Namespace) -> int:
    from verl_tlt.bench.adaptive_bench import run as run_adaptive

    workload = options(args, "num_requests", "max_tokens", "repeats", "device", "cuda_graphs")
    config = speculative_config(args, ADAPTIVE_POLICY_KEYS)
    run_adaptive(args.json, config=config, subject=subject_of(args), **workload)
    return 0


# ----- replay ------------------------------------------------------------------------------------------------


REPLAY_HELP = "adaptive policy vs plain and fixed strategies on a rollout replayed from recorded step costs"


def _add_replay(bench: argparse._SubParsersAction) -> None:
    replay = add_command(bench, "replay", _run_replay, REPLAY_HELP)
    replay.add_argument("--json", help="write results to this path")
    replay.add_argument("--costs", help="replay this recording (from --save-costs) instead of recording one")
    replay.add_argument("--save-costs", help="write the recorded step costs to this path")
    replay.add_argument("--device", default="cpu", help="torch device to record on (e.g. cuda); replays run anywhere")
    replay.add_argument("--cuda-graphs", action="store_true", help="record with RolloutEngine(cuda_graphs=True)")
    replay.add_argument("--num-requests", type=positive_int, default=256, help="prompts of the recorded rollout")
    replay.add_argument("--max-tokens", type=positive_int, default=1024, help="cap on each answer's tokens")
    replay.add_argument(
        "--repeats", type=positive_int, default=2, help="recorded rollouts per strategy (plain included)"
    )
    replay.add_argument("--seeds", type=positive_int, default=30, help="replays per policy, averaged")
    _add_policy_overrides(replay, REPLAY_POLICY_KEYS)


def _run_replay(args: argparse.Namespace) -> int:
    from verl_tlt.bench.replay_bench import run as run_replay

    workload = options(args, "num_requests", "max_tokens", "repeats", "seeds", "device", "cuda_graphs")
    recording = {"costs_path": args.costs, "save_costs": args.save_costs}
    run_replay(args.json, speculative_config(args, REPLAY_POLICY_KEYS), **recording, **workload)
    return 0


# ----- drafter-replay ----------------------------------------------------------------------------------------


DRAFTER_REPLAY_HELP = "a drafter-training recipe replayed on an RL run's recorded captures (tlt.drafter.record_dir)"


def _add_drafter_replay(bench: argparse._SubParsersAction) -> None:
    drafter_replay = add_command(bench, "drafter-replay", _run_drafter_replay, DRAFTER_REPLAY_HELP)
    drafter_replay.add_argument("--record", required=True, help="the run's tlt.drafter.record_dir")
    drafter_replay.add_argument("--json", help="write results to this path")
    drafter_replay.add_argument(
        "--target", help="the run's initial policy (model.path); default: the quickstart's cached toy target"
    )
    drafter_replay.add_argument(
        "--drafter", help="the run's tlt.drafter.init; default: the quickstart's warmed-up toy drafter"
    )
    drafter_replay.add_argument(
        "--steps-per-rl-step",
        nargs="+",
        type=int,
        default=[4],
        help="drafter optimizer steps before each recorded step is scored: one number, or one per step",
    )
    # Defaults (None) are tlt.drafter's, filled in below.
    drafter_replay.add_argument("--lr", type=float, help="tlt.drafter.lr")
    drafter_replay.add_argument("--batch-tokens", type=int, help="tlt.drafter.max_tokens_per_batch")
    drafter_replay.add_argument("--buffer-tokens", type=int, help="tlt.drafter.buffer_tokens")
    drafter_replay.add_argument("--train-depth", type=int, help="tlt.drafter.train_depth")
    drafter_replay.add_argument("--hidden-loss-weight", type=float, help="tlt.drafter.hidden_loss_weight")
    drafter_replay.add_argument("--logit-loss-weight", type=float, help="tlt.drafter.logit_loss_weight")
    drafter_replay.add_argument("--threads", type=int, default=1, help="torch threads (a drafter worker uses 1)")


def _run_drafter_replay(args: argparse.Namespace) -> int:
    from verl_tlt.bench.drafter_replay import run as run_drafter_replay
    from verl_tlt.config import DrafterConfig

    if min(args.steps_per_rl_step) < 0 or args.threads < 1:
        usage_error(args, "--steps-per-rl-step must be >= 0 and --threads >= 1")
    overrides = {
        "lr": args.lr,
        "max_tokens_per_batch": args.batch_tokens,
        "buffer_tokens": args.buffer_tokens,
        "train_depth": args.train_depth,
        "hidden_loss_weight": args.hidden_loss_weight,
        "logit_loss_weight": args.logit_loss_weight,
    }
    try:
        train_config = DrafterConfig(**{key: value for key, value in overrides.items() if value is not None})
    except ValueError as error:
        usage_error(args, str(error))
    target, drafter = args.target, args.drafter
    if target is None or drafter is None:
        from verl_tlt.toy.drafter import ensure_toy_drafter
        from verl_tlt.toy.sft import DRIFTING_COMPACT_SHARE, ensure_toy_target

        target = target or str(ensure_toy_target(compact_share=DRIFTING_COMPACT_SHARE))
        drafter = drafter or str(ensure_toy_drafter(compact_share=DRIFTING_COMPACT_SHARE))
    try:
        run_drafter_replay(
            args.json, args.record, target, drafter, train_config, args.steps_per_rl_step, threads=args.threads
        )
    except (FileNotFoundError, ValueError) as error:  # no recording, an unreadable one, or a wrong budget list
        usage_error(args, str(error))
    return 0


# ----- shared ------------------------------------------------------------------------------------------------

# Help of the `tlt.speculative` overrides the policy benchmarks take (only those a benchmark names are added).
_POLICY_OVERRIDES = {
    "threshold": dict(type=int, help="override tlt.speculative.threshold"),
    "strategies": dict(nargs="+", help="override tlt.speculative.strategies"),
    "epsilon": dict(type=float, help="override tlt.speculative.epsilon"),
    "window": dict(type=int, help="override tlt.speculative.window"),
    "buckets": dict(nargs="+", type=int, help="override tlt.speculative.buckets"),
}


def _add_policy_overrides(parser: argparse.ArgumentParser, keys: tuple[str, ...]) -> None:
    for key in keys:
        parser.add_argument(f"--{key}", default=None, **_POLICY_OVERRIDES[key])


def speculative_config(args: argparse.Namespace, keys: tuple[str, ...]):
    """`tlt.speculative` defaults with the given command-line overrides (those not passed keep the default); a
    combination the config refuses is a usage error."""
    import dataclasses

    from verl_tlt.config import SpeculativeConfig

    overrides = {key: getattr(args, key) for key in keys if getattr(args, key) is not None}
    overrides = {key: tuple(value) if isinstance(value, list) else value for key, value in overrides.items()}
    try:
        return dataclasses.replace(SpeculativeConfig(), **overrides)
    except ValueError as error:
        usage_error(args, str(error))
