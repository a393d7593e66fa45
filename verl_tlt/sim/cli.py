"""`verl-tlt simulate`: the RL-step simulator's commands.

- `simulate run --config PRESET|YAML`: a scenario's runs (baseline, TLT, ablations) step by step; `--json`, `--plot`.
- `simulate paper`: the paper's scaling table, simulated from the presets, with the ablations and a projection.
- `simulate presets`: the presets and what each describes.
- `simulate replay`: checks the event model against a run it can see: each recorded rollout is replayed from its own
  requests (arrivals, lengths) and the run's measured step costs, and the predicted rollout times are printed beside
  the measured ones.
"""

from __future__ import annotations

import argparse
import time

from verl_tlt.commands import add_command, add_group, positive_int, run_alone, usage_error


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `simulate` and its commands to the `verl-tlt` command tree."""
    simulate = add_group(subparsers, "simulate", "the RL-step simulator: what TLT buys on a cluster, and why")
    run = add_command(
        simulate, "run", _run_scenario, "simulate a scenario's RL steps: the baseline, TLT and the runs it names"
    )
    run.add_argument(
        "--config", required=True, help="a preset name (`verl-tlt simulate presets`) or a scenario YAML file"
    )
    run.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="override scenario keys, dotted (cluster.nodes=8 tlt.threshold=16 runs=[baseline,tlt])",
    )
    run.add_argument("--json", help="write every run's per-step results to this path")
    run.add_argument("--plot", help="draw one RL step of every run as a Gantt chart to this PNG (needs matplotlib)")
    run.add_argument("--plot-step", type=int, default=-1, help="which RL step to draw (0-based; -1 = the last)")
    paper = add_command(
        simulate, "paper", _run_paper, "the TLT paper's scaling table simulated from the presets, with ablations"
    )
    paper.add_argument("--steps", type=positive_int, help="RL steps per cell (default: the presets')")
    paper.add_argument(
        "--no-projection", action="store_true", help="skip the 8-node projection of verl-tlt's additions"
    )
    paper.add_argument("--json", help="write the table to this path")
    add_command(simulate, "presets", _run_presets, "list the scenario presets")
    calibrate = add_command(
        simulate,
        "calibrate",
        _run_calibrate,
        "fit a scenario to a baseline and a frozen-drafter run's rollout records (the quickstart-cpu preset)",
    )
    calibrate.add_argument("--baseline", required=True, help="the TLT-off run's rollout records (rollout_trace.jsonl)")
    calibrate.add_argument(
        "--speculative", required=True, help="a TLT run's rollout records, best the frozen-drafter run's"
    )
    calibrate.add_argument(
        "--summary",
        help="the quickstart's summary.json, for the baseline's non-rollout seconds per step (or give --other-s)",
    )
    calibrate.add_argument("--other-s", type=float, help="seconds per RL step outside the rollout")
    calibrate.add_argument("--strategies", nargs="+", default=["4_1_4", "2_1_2"], help="the TLT run's strategies")
    calibrate.add_argument("--threshold", type=positive_int, default=32, help="the TLT run's threshold")
    calibrate.add_argument("--out", required=True, help="write OUT.yaml (the scenario) and OUT-lengths.json")
    calibrate.add_argument("--source", action="append", default=[], help="a line for the scenario's sources")
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


def _run_presets(args: argparse.Namespace) -> int:
    from verl_tlt.sim.scenario import load, preset_names

    for name in preset_names():
        scenario, _ = load(name)
        print(f"{name}: {scenario.description}")
    return 0


def _run_scenario(args: argparse.Namespace) -> int:
    from verl_tlt.files import write_json
    from verl_tlt.progress import format_duration
    from verl_tlt.sim.report import run_json, run_lines
    from verl_tlt.sim.rl_step import simulate_scenario
    from verl_tlt.sim.scenario import load

    try:
        scenario, base_dir = load(args.config, dict(_parse_override(args, item) for item in args.set))
    except ValueError as error:
        usage_error(args, str(error))
    started = time.monotonic()
    print(f"simulating {', '.join(scenario.runs)} ({scenario.steps} RL steps each) ...", flush=True)

    def report(run: str) -> None:
        print(f"  {run} done ({format_duration(time.monotonic() - started)})", flush=True)

    try:
        runs = simulate_scenario(scenario, base_dir, keep_timelines=bool(args.plot), progress=report)
    except ValueError as error:
        usage_error(args, str(error))
    print("\n".join(run_lines(scenario, runs)))
    if args.json:
        write_json(args.json, run_json(scenario, runs))
        print(f"wrote {args.json}")
    if args.plot:
        from verl_tlt.sim.plot import plot_step

        step = args.plot_step if args.plot_step >= 0 else scenario.steps + args.plot_step
        if not 0 <= step < scenario.steps:
            usage_error(args, f"--plot-step {args.plot_step} is outside the {scenario.steps} simulated steps")
        print(f"wrote {plot_step(runs, step, args.plot)} (RL step {step})")
    return 0


def _run_paper(args: argparse.Namespace) -> int:
    from verl_tlt.files import write_json
    from verl_tlt.progress import format_duration
    from verl_tlt.sim.paper import PAPER_CELLS, PROJECTIONS, simulate_paper, simulate_projection
    from verl_tlt.sim.report import paper_json, paper_lines

    started, done = time.monotonic(), [0]
    total = len(PAPER_CELLS) + (0 if args.no_projection else len(PROJECTIONS))

    def report(what: str) -> None:
        done[0] += 1
        elapsed = time.monotonic() - started
        left = format_duration(elapsed / done[0] * (total - done[0]))
        print(f"  [{done[0]}/{total}] {what} ({format_duration(elapsed)}, about {left} left)", flush=True)

    print(f"simulating {total} scenarios (every run of each; about a minute) ...", flush=True)
    cells = simulate_paper(args.steps, progress=report)
    projection = None if args.no_projection else simulate_projection(args.steps, progress=report)
    print("\n".join(paper_lines(cells, projection)))
    if args.json:
        write_json(args.json, paper_json(cells, projection))
        print(f"wrote {args.json}")
    return 0


def _parse_override(args: argparse.Namespace, item: str) -> tuple[str, object]:
    """KEY=VALUE, the value read as YAML (numbers, lists, booleans), '1e-3' style numbers included."""
    import yaml

    key, sep, text = item.partition("=")
    if not sep or not key:
        usage_error(args, f"--set {item!r}: expected KEY=VALUE, e.g. cluster.nodes=8")
    try:
        return key, float(text) if _looks_like_float(text) else yaml.safe_load(text)
    except yaml.YAMLError as error:
        usage_error(args, f"--set {item!r}: the value is not YAML ({error})")


def _looks_like_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return not text.strip().lstrip("+-").isdigit()  # integers stay integers


def _run_calibrate(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    import yaml

    from verl_tlt.sim.calibration import read_rollouts
    from verl_tlt.sim.fit import quickstart_scenario

    try:
        baseline, speculative = read_rollouts(args.baseline), read_rollouts(args.speculative)
    except (OSError, ValueError, KeyError) as error:
        usage_error(args, f"cannot read the rollout records: {error}")
    other_s = args.other_s if args.other_s is not None else _other_seconds(args)
    out = Path(args.out)
    lengths_path = out.with_name(out.name + "-lengths.json")
    lengths = [[n for replica in rollout.replicas for n in replica.lengths] for rollout in baseline[0]]
    lengths_path.parent.mkdir(parents=True, exist_ok=True)
    lengths_path.write_text(json.dumps(lengths) + "\n")
    try:
        values = quickstart_scenario(
            baseline,
            speculative,
            lengths_file=lengths_path.name,
            other_s=other_s,
            strategies=args.strategies,
            threshold=args.threshold,
            sources=args.source,
        )
    except ValueError as error:
        usage_error(args, str(error))
    scenario_path = out.with_name(out.name + ".yaml")
    header = "# Written by `verl-tlt simulate calibrate` from measured rollout records; see `sources`.\n"
    scenario_path.write_text(header + yaml.safe_dump(values, sort_keys=False, width=118))
    for line in values["sources"]:
        print(f"  {line}")
    print(f"wrote {scenario_path} and {lengths_path}")
    return 0


def _other_seconds(args: argparse.Namespace) -> float:
    """The baseline's mean step time minus its rollout time, from the quickstart's summary.json."""
    import json
    from pathlib import Path

    if not args.summary:
        usage_error(args, "give --summary <quickstart out>/summary.json or --other-s SECONDS")
    try:
        steps = json.loads(Path(args.summary).read_text())["runs"]["baseline"]
        others = [row["step_s"] - row["rollout_s"] for row in steps if row.get("step_s") and row.get("rollout_s")]
    except (OSError, ValueError, KeyError, TypeError) as error:
        usage_error(args, f"--summary {args.summary}: no baseline step and rollout times ({error})")
    if not others:
        usage_error(args, f"--summary {args.summary}: the baseline run has no step with both times")
    return sum(others) / len(others)
