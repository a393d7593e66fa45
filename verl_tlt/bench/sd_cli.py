"""`verl-tlt bench sd {curve,drafts,families,vllm}`: speculative vs plain decoding, one subcommand per measurement.

- `curve`: the torch engine's speedup curve over batch sizes and the acceptance lengths, per strategy;
- `drafts SOURCE...`: draft sources (the drafter, the GRPO group's text, both) on the tails of groups;
- `families`: an EAGLE-3 drafter against an EAGLE-1 one (acceptance, batch-1 speed, a control arm);
- `vllm`: the same target and drafter on vLLM, as TLT sets it up in verl (fixed K, the threshold gate, the adaptive
  K policy on a long tail).

Each subcommand has exactly the options it reads, so none is silently ignored.
"""

from __future__ import annotations

import argparse

from verl_tlt.commands import add_command, add_group, positive_int, usage_error

SD_STRATEGIES = ("8_4_16", "4_1_4")
SD_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
GROUP_SD_SHAPES = ("4_1_4", "8_1_8")
GROUP_SD_BATCH_SIZES = (1, 2, 4, 8, 16)
DRAFT_SOURCES = ("eagle", "suffix", "mixed")


def add_sd(bench: argparse._SubParsersAction) -> None:
    sd = add_group(bench, "sd", "speculative vs plain decoding, the toy target or a real model (acceptance, speedup)")
    curve = add_command(sd, "curve", _run_curve, "the torch engine's speedup curve and acceptance lengths")
    _add_measurement(curve, SD_BATCH_SIZES)
    _add_torch_engine(curve)
    curve.add_argument(
        "--strategies",
        nargs="+",
        default=list(SD_STRATEGIES),
        help="depth_topk_treetokens (top-k 1 = chain); the first one gives the headline acceptance lengths",
    )
    curve.add_argument("--temperature", type=float, default=0.0, help="for the speedup curve (0 = greedy)")
    curve.add_argument("--acceptance-prompts", type=int, default=32, help="prompts for the acceptance lengths")
    curve.add_argument(
        "--compile", action="store_true", help="RolloutEngine(compile=True): the target's forwards torch.compile'd"
    )
    curve.add_argument("--cuda-graphs", action="store_true", help="RolloutEngine(cuda_graphs=True) (CUDA only)")

    drafts = add_command(
        sd,
        "drafts",
        _run_drafts,
        "draft sources compared on the tail of GRPO groups whose siblings have finished: eagle (the drafter), suffix "
        "(model-free drafts from the siblings' answers), mixed (suffix where a match is found, the drafter elsewhere)",
    )
    drafts.add_argument("sources", nargs="+", choices=DRAFT_SOURCES, help="the draft sources to compare")
    _add_measurement(drafts, GROUP_SD_BATCH_SIZES)
    _add_torch_engine(drafts)
    drafts.add_argument(
        "--strategies", nargs="+", default=list(GROUP_SD_SHAPES), help="the shapes each source drafts in"
    )
    drafts.add_argument("--group-size", type=positive_int, default=8, help="samples per prompt (the tail and siblings)")
    drafts.add_argument(
        "--temperatures",
        nargs="+",
        type=float,
        default=[0.0, 1.0, 2.0],
        help="sampling temperatures measured (keyed sampling keeps every arm's tokens identical)",
    )

    _add_families(sd)

    vllm = add_command(
        sd,
        "vllm",
        _run_vllm,
        "vLLM set up as TLT sets it up in verl (needs vLLM: scripts/setup_vllm_env.sh, then .venv-vllm/bin/verl-tlt)",
    )
    _add_measurement(vllm, SD_BATCH_SIZES)
    vllm.add_argument("--ks", nargs="+", type=int, default=[2, 4, 6, 8], help="chain depths K, one SD engine each")
    vllm.add_argument(
        "--threshold",
        type=int,
        default=8,
        help="the gated engines speculate up to this many running requests; measured at the batch sizes above it",
    )
    vllm.add_argument(
        "--long-tail-prompts",
        type=int,
        default=64,
        help="prompts of the long-tail rollout on which the adaptive K policy meets the best fixed K",
    )
    vllm.add_argument(
        "--catch-up-window",
        type=int,
        default=None,
        help="TLT's engines: positions a request's drafter may fall behind on K=0 steps before it catches up "
        "(default: tlt.speculative.vllm_catch_up_window; 0 = vLLM's first pass every step)",
    )
    vllm.add_argument(
        "--catch-up-sweep",
        nargs="*",
        type=int,
        default=None,
        help="windows at which the catch-up's cost and acceptance are measured on the long tail against vLLM's first "
        "pass every step (default: 16 64 256; none: skip)",
    )


def _add_families(sd: argparse._SubParsersAction) -> None:
    families = add_command(
        sd,
        "families",
        _run_families,
        "an EAGLE-3 drafter against an EAGLE-1 drafter of the same target: acceptance and batch-1 speed, with a "
        "repeated EAGLE-1 arm as the control (torch engine, or vLLM's CPU build)",
    )
    families.add_argument("--json", help="write results to this path")
    families.add_argument(
        "--model", default="toy", help="toy (the trained toy target) or a real model of `verl-tlt models list`"
    )
    for family in ("eagle", "eagle3"):
        families.add_argument(
            f"--{family}",
            default=None,
            help=f"the {family} drafter's export folder (default: the model's cached warm-up drafter of that family, "
            "trained on first use)",
        )
    families.add_argument("--engine", choices=["torch", "vllm"], default="torch", help="which engine decodes")
    families.add_argument("--k", type=positive_int, default=4, help="chain depth K (the same for both drafters)")
    families.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    families.add_argument("--prompts", type=positive_int, default=16, help="fresh prompts, decoded one at a time")
    families.add_argument("--max-tokens", type=positive_int, default=256, help="cap on each answer's tokens")


def _add_measurement(parser: argparse.ArgumentParser, batch_sizes: tuple[int, ...]) -> None:
    parser.add_argument("--json", help="write results to this path")
    add_model_argument(parser)
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=list(batch_sizes), help="batch sizes measured")
    parser.add_argument("--max-tokens", type=int, default=512, help="cap on each answer's tokens")
    parser.add_argument("--rounds", type=int, default=4, help="batches of fresh prompts per batch size, summed")


def _add_torch_engine(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="torch device of target and drafter (e.g. cuda)")
    parser.add_argument(
        "--sampling",
        choices=["keyed", "rejection"],
        default="keyed",
        help="RolloutEngine(sampling=...): how sampled rows draw and verify (keyed Gumbel coupling, or rejection)",
    )
    parser.add_argument(
        "--toy-shape",
        default="default",
        help="toy target shape (verl_tlt.toy.model.TOY_SHAPES); deep = 8 layers of width 96, trained and cached on "
        "first use",
    )


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="toy",
        help="what is decoded: toy (the trained toy target, the fast default) or a real model of `verl-tlt models "
        "list` (prepared, and its drafter warmed up on its own answers to the real tasks on first use, which takes "
        "tens of minutes on a CPU; or pass --drafter)",
    )
    parser.add_argument(
        "--drafter",
        default=None,
        help="an exported drafter folder (e.g. `verl-tlt drafter warmup --out`) to draft with instead of the "
        "model's cached warm-up drafter",
    )


def subject_of(args: argparse.Namespace):
    """The `verl_tlt.bench.subject.BenchSubject` that --model (and --toy-shape, where the command has it) name."""
    from verl_tlt.bench.subject import bench_subject, known_subjects
    from verl_tlt.models.prepare import MODEL_ERRORS

    if args.model not in known_subjects():
        usage_error(args, f"--model must be one of {', '.join(known_subjects())}, got {args.model!r}")
    toy_shape = getattr(args, "toy_shape", "default")
    if args.model != "toy" and toy_shape != "default":
        usage_error(args, f"--toy-shape applies to --model toy only, not to --model {args.model}")
    try:
        return bench_subject(args.model, toy_shape, args.drafter)
    except MODEL_ERRORS as error:
        usage_error(args, str(error))


def _check_measurement(args: argparse.Namespace) -> None:
    if min(args.batch_sizes + [args.max_tokens, args.rounds]) < 1:
        usage_error(args, "--batch-sizes, --max-tokens and --rounds must be >= 1")


def _check_toy_shape(args: argparse.Namespace) -> None:
    from verl_tlt.toy.model import TOY_SHAPES

    if args.toy_shape not in TOY_SHAPES:
        usage_error(args, f"--toy-shape must be one of {sorted(TOY_SHAPES)}, got {args.toy_shape!r}")


def _run_curve(args: argparse.Namespace) -> int:
    from verl_tlt.bench.sd_bench import run as run_sd
    from verl_tlt.spec.strategy import SpecStrategy

    _check_measurement(args)
    _check_toy_shape(args)
    for strategy in args.strategies:
        try:
            SpecStrategy.parse(strategy)
        except ValueError as error:
            usage_error(args, f"--strategies: {error}")
    if args.acceptance_prompts < 1:
        usage_error(args, "--acceptance-prompts must be >= 1")
    run_sd(
        args.json,
        args.strategies,
        args.batch_sizes,
        args.temperature,
        args.max_tokens,
        args.acceptance_prompts,
        subject_of(args),
        args.rounds,
        device=args.device,
        compile=args.compile,
        cuda_graphs=args.cuda_graphs,
        sampling=args.sampling,
    )
    return 0


def _run_drafts(args: argparse.Namespace) -> int:
    from verl_tlt.bench.group_sd_bench import GroupBenchConfig
    from verl_tlt.bench.group_sd_bench import run as run_group_sd
    from verl_tlt.spec.strategy import EAGLE, SpecStrategy

    _check_measurement(args)
    _check_toy_shape(args)
    for shape in args.strategies:
        try:
            source = SpecStrategy.parse(shape).source
        except ValueError as error:
            usage_error(args, f"--strategies: {error}")
        if source != EAGLE:
            usage_error(args, f"--strategies are shapes such as 4_1_4 (the sources are named before), got {shape!r}")
    if min(args.temperatures) < 0:
        usage_error(args, f"--temperatures must be >= 0, got {args.temperatures}")
    config = GroupBenchConfig(
        drafts=tuple(dict.fromkeys(args.sources)),  # a source named twice is measured once
        shapes=tuple(args.strategies),
        temperatures=tuple(args.temperatures),
        batch_sizes=tuple(args.batch_sizes),
        group_size=args.group_size,
        rounds=args.rounds,
        max_tokens=args.max_tokens,
    )
    run_group_sd(args.json, config, subject_of(args), device=args.device, sampling=args.sampling)
    return 0


def _run_families(args: argparse.Namespace) -> int:
    import importlib.util

    from verl_tlt.bench.family_bench import run as run_families
    from verl_tlt.bench.subject import family_drafters

    if args.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        usage_error(args, "--engine vllm needs vLLM: run scripts/setup_vllm_env.sh and use .venv-vllm/bin/verl-tlt")
    if args.temperature < 0:
        usage_error(args, f"--temperature must be >= 0, got {args.temperature}")
    from verl_tlt.bench.subject import known_subjects
    from verl_tlt.models.prepare import MODEL_ERRORS

    if args.model not in known_subjects():
        usage_error(args, f"--model must be one of {', '.join(known_subjects())}, got {args.model!r}")
    try:
        subject, drafters = family_drafters(args.model, {"eagle": args.eagle, "eagle3": args.eagle3})
    except MODEL_ERRORS as error:
        usage_error(args, str(error))
    run_families(
        args.json,
        subject,
        drafters,
        k=args.k,
        temperature=args.temperature,
        num_prompts=args.prompts,
        max_tokens=args.max_tokens,
        engine=args.engine,
    )
    return 0


def _run_vllm(args: argparse.Namespace) -> int:
    import importlib.util

    _check_measurement(args)
    if importlib.util.find_spec("vllm") is None:
        usage_error(
            args,
            "bench sd vllm needs vLLM in this environment: run scripts/setup_vllm_env.sh and use "
            ".venv-vllm/bin/verl-tlt (on a GPU machine: pip install the vLLM your verl pins)",
        )
    if min(args.ks + [args.threshold, args.long_tail_prompts]) < 1:
        usage_error(args, "--ks, --threshold and --long-tail-prompts must be >= 1")
    if args.catch_up_window is not None and args.catch_up_window < 0:
        usage_error(args, f"--catch-up-window must be >= 0 (0 = off), got {args.catch_up_window}")
    if args.catch_up_sweep and min(args.catch_up_sweep) < 1:
        usage_error(args, f"--catch-up-sweep windows must be >= 1, got {args.catch_up_sweep}")
    from verl_tlt.bench.vllm_sd_bench import run as run_vllm_sd

    run_vllm_sd(
        args.json,
        args.ks,
        args.batch_sizes,
        args.max_tokens,
        args.rounds,
        args.threshold,
        subject_of(args),
        long_tail_prompts=args.long_tail_prompts,
        catch_up_window=args.catch_up_window,
        catch_up_sweep=args.catch_up_sweep,
    )
    return 0
