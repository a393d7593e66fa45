"""The CPU quickstart: the same verl GRPO run on the toy world three times, without TLT, with TLT, and with TLT
but a frozen drafter, and a comparison of the three.

`recipes/quickstart_cpu.sh` runs this (after setting up the virtualenv); `verl-tlt quickstart` is the same.
- The actor starts from an SFT toy target that writes both solution styles of the task (standard, and 10% of
  its SFT data compact) and the reward prefers the compact one (`toy.reward.compute_score_concise`), so RL moves
  the policy towards a style the drafter rarely saw: the policy drifts, as a reasoning model's does in RL.
- The drafter starts from a warm-up on the initial target's own answers (`verl-tlt drafter warmup`, cached).
- Two rollout replicas of one CPU core each, so a replica that drains frees a core for spot training.
Writes `outputs/quickstart/summary.json` (per-step rows of every run and the headline ratios) and
`outputs/quickstart/comparison.png`; target and drafter are trained once (a few CPU minutes) and cached.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from verl_tlt.commands import add_command
from verl_tlt.engine.decode_stats import ms_per_token_by_batch
from verl_tlt.integrations.verl.request_seeds import SLOT_AGENT_LOOP
from verl_tlt.quickstart.summary import format_decode_costs, format_table, headline, read_trace, step_rows
from verl_tlt.quickstart.verl_job import read_rollouts, run_verl_job

logger = logging.getLogger(__name__)

# The three runs: name -> extra overrides (the drafter path is filled in at run time).
RUNS = {
    "baseline": ["tlt.enabled=false"],
    "tlt": ["tlt.enabled=true", "tlt.drafter.train=true"],
    "frozen": ["tlt.enabled=true", "tlt.drafter.train=false"],
}
TRACE_FILE = "rollout_trace.jsonl"
# Drafter training for a 1M-parameter target on one CPU core. Replayed on a recorded quickstart run (`verl-tlt
# bench drafter-replay`, README), 256-token batches at lr 1e-3 followed the drifting policy best for the same
# compute (about 5 steps per 1024-token step): est. acceptance 1.27x the frozen drafter's vs 1.19x with 1024-token
# batches; higher lr (3e-3, 1e-2) or a heavier logit loss did not help. Short steps also bound how long training can
# run past the last response.
TOY_DRAFTER_OVERRIDES = ["tlt.drafter.max_tokens_per_batch=256", "tlt.drafter.lr=1e-3"]
# Chains only: on this CPU every tree strategy decodes the toy slower than plain at every batch size, while the
# chains gain (`verl-tlt bench sd --strategies 8_4_16 6_4_8 4_1_4 2_1_2`, README); exploring the trees would only
# cost the bandit steps. The default set (with trees) is for accelerators, where verifying more tokens is cheap.
CPU_STRATEGY_OVERRIDES = ['tlt.speculative.strategies=["4_1_4","2_1_2"]']


def toy_grpo_overrides(
    world,
    *,
    steps: int,
    batch_size: int,
    group_size: int,
    max_response_length: int,
    lr: float,
    reward_fn: str | None = None,
    model_dir: str | Path | None = None,
    replicas: int = 1,
) -> list[str]:
    """verl overrides for GRPO on the toy world on CPU (everything platform-specific comes from +cpu=torch).

    model_dir: the actor's initial weights (default: the world's untrained model), e.g. the SFT toy target.
    replicas: trainer workers = rollout replicas (one CPU core each); each worker gets an equal share of a batch.
    """
    if (batch_size * group_size) % replicas:
        raise ValueError(f"{batch_size} prompts x {group_size} samples do not split evenly over {replicas} replicas")
    mini_batch = batch_size
    micro_batch = batch_size * group_size // replicas
    return [
        "+cpu=torch",
        "algorithm.adv_estimator=grpo",
        f"data.train_files={world.train_parquet}",
        f"data.val_files={world.val_parquet}",
        f"data.train_batch_size={batch_size}",
        "data.max_prompt_length=16",
        f"data.max_response_length={max_response_length}",
        f"actor_rollout_ref.model.path={model_dir or world.model_dir}",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_batch}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        f"actor_rollout_ref.rollout.n={group_size}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro_batch}",
        f"reward.custom_reward_function.path={reward_fn or world.reward_fn}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        f"trainer.n_gpus_per_node={replicas}",
        "trainer.save_freq=-1",
        f"trainer.total_training_steps={steps}",
        "trainer.project_name=verl_tlt_quickstart",
        "trainer.experiment_name=toy_grpo",
    ]


def same_responses_steps(responses: dict[str, dict[int, list]]) -> dict[str, str]:
    """Per run: in how many steps it sampled exactly the baseline's responses ("k/n")."""
    baseline = responses.get("baseline", {})
    return {
        name: f"{sum(by_step.get(step) == dump for step, dump in baseline.items())}/{len(baseline)}"
        for name, by_step in responses.items()
        if name != "baseline"
    }


def check_same_tokenizer(world_model_dir: Path, actor_dir: Path) -> None:
    """The parquet prompts and the reward parse text in the world's tokenizer; the actor must use the same one.

    Compared by behaviour (vocabulary, chat template, a round trip), not by file bytes, which may differ
    harmlessly across transformers versions.
    """
    from transformers import AutoTokenizer

    world, actor = (AutoTokenizer.from_pretrained(str(d)) for d in (world_model_dir, actor_dir))
    sample = "23 - 7 = 16 ; 16 - 7 = 9 ; 9 - 7 = 2 ; 2 - 7 < 0 ; # 2"
    same = (
        world.get_vocab() == actor.get_vocab()
        and world.chat_template == actor.chat_template
        and world.encode(sample, add_special_tokens=False) == actor.encode(sample, add_special_tokens=False)
        and actor.decode(actor.encode(sample, add_special_tokens=False)) == sample
    )
    if not same:
        raise RuntimeError(
            f"The tokenizer in {actor_dir} differs from the toy world's ({world_model_dir}): the actor would read "
            "the prompts and write responses in another tokenisation. Delete the stale cache entries and rerun."
        )


def run_comparison(args: argparse.Namespace) -> dict:
    from verl_tlt.toy.build import build_toy_world
    from verl_tlt.toy.cache import default_cache_root
    from verl_tlt.toy.drafter import ensure_toy_drafter
    from verl_tlt.toy.sft import DRIFTING_COMPACT_SHARE, ensure_toy_target

    args.cache = Path(args.cache) if args.cache else default_cache_root()
    world = build_toy_world(args.cache / "toy-world")
    logger.info("toy world: %s", world.root)
    target = ensure_toy_target(args.cache, compact_share=DRIFTING_COMPACT_SHARE)
    check_same_tokenizer(world.model_dir, target)
    drafter = ensure_toy_drafter(args.cache, compact_share=DRIFTING_COMPACT_SHARE)
    logger.info("actor: toy target %s; drafter warmed up on it: %s", target, drafter)
    common = toy_grpo_overrides(
        world,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_response_length=args.max_response_length,
        lr=args.lr,
        model_dir=target,
        replicas=args.replicas,
    )
    common += [
        # Requests named after their sample slot, whose keyed sampling the torch rollout seeds from that name: every
        # slot samples alike in the three runs, and speculative decoding changes no token, so the runs differ in
        # how fast they decode, not in what they sample (as long as training, which then sees the same samples,
        # stays bitwise the same).
        f"actor_rollout_ref.rollout.agent.default_agent_loop={SLOT_AGENT_LOOP}",
        "reward.custom_reward_function.name=compute_score_concise",
        f"tlt.drafter.init={drafter}",
        *TOY_DRAFTER_OVERRIDES,
        *CPU_STRATEGY_OVERRIDES,
        *args.override,  # last, so they win over the defaults above
    ]
    out = Path(args.out)
    runs, wall, responses, decode = {}, {}, {}, {}
    for name in args.runs:
        extra = RUNS[name]
        run_dir = (out / name).resolve()
        (run_dir / TRACE_FILE).unlink(missing_ok=True)
        trace = f"+actor_rollout_ref.rollout.engine_kwargs.torch.trace_path={run_dir / TRACE_FILE}"
        logger.info("run %s", name)
        result = run_verl_job(
            [*common, *extra, trace], run_dir, timeout_s=args.timeout, entry_module="verl_tlt.main_ppo"
        )
        rollouts = {m["step"]: read_rollouts(result.rollout_dump_dir, m["step"]) for m in result.metrics}
        trace = read_trace(run_dir / TRACE_FILE)
        runs[name] = step_rows(result.metrics, trace, rollouts)
        decode[name] = ms_per_token_by_batch(
            [r.get("decode_costs") or {} for records in trace.values() for r in records]
        )
        wall[name] = round(result.wall_s, 1)
        responses[name] = {step: sorted((r["input"], r["output"]) for r in dump) for step, dump in rollouts.items()}
    complete = set(runs) == set(RUNS)
    return {
        "job": f"toy GRPO on CPU, torch rollout, {args.replicas} replicas: baseline vs TLT vs TLT, frozen drafter",
        **(headline(runs) if complete else {}),
        "steps_with_baseline_responses": same_responses_steps(responses),
        # Decode ms per committed token by batch-size group (powers of two), plain and speculative steps, over the
        # run's rollouts: whether speculation paid at each batch size. Plain and SD steps of one run ran at the same
        # moments; across runs the machine's drift is in the comparison too.
        "decode_ms_per_token_by_batch": decode,
        "wall_s": wall,
        "runs": runs,
        "overrides": common,
    }


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `quickstart` to the `verl-tlt` command tree."""
    one_line = "the CPU quickstart: toy GRPO without TLT, with TLT, and with TLT but a frozen drafter, compared"
    add_arguments(add_command(subparsers, "quickstart", run, one_line, description=__doc__.split("\n\n")[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verl-tlt quickstart", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[quickstart] %(message)s")
    return run(args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="outputs/quickstart", help="output directory (summary.json, plot, logs)")
    parser.add_argument(
        "--cache",
        default=None,
        help="where the toy world, target and drafter are built and reused (default: $VERL_TLT_CACHE, else "
        "~/.cache/verl-tlt)",
    )
    # The drift (compact share 5% -> ~90%) is complete by about step 8 at lr 5e-4; the steps after it show whether the
    # online drafter catches up with the drifted policy while the frozen one stays behind (README, quickstart table).
    parser.add_argument("--steps", type=int, default=15, help="GRPO steps per run")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="GRPO samples per prompt (rollout.n)")
    parser.add_argument("--max-response-length", type=int, default=256, help="data.max_response_length")
    parser.add_argument("--lr", type=float, default=5e-4, help="the actor's learning rate")
    parser.add_argument("--replicas", type=int, default=2, help="rollout replicas (one CPU core each)")
    parser.add_argument("--timeout", type=float, default=1200, help="hard limit per verl job, seconds")
    parser.add_argument("--no-plot", action="store_true", help="skip comparison.png (no matplotlib needed)")
    parser.add_argument(
        "--runs",
        nargs="+",
        choices=list(RUNS),
        default=list(RUNS),
        help="which runs to make (the comparison needs all three; fewer are for experiments)",
    )
    parser.add_argument(
        "--override",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="extra verl/tlt overrides for every run, after the quickstart's own (e.g. tlt.drafter.lr=3e-3)",
    )


def run(args: argparse.Namespace) -> int:
    summary = run_comparison(args)
    out = Path(args.out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if set(summary["runs"]) != set(RUNS):
        for name, rows in summary["runs"].items():
            print(name, json.dumps(rows))
        print(f"summary (partial, no comparison): {out / 'summary.json'}")
        return 0
    print(format_table(summary["runs"]))
    if not args.no_plot:
        from verl_tlt.quickstart.plot import plot_comparison

        print(f"plot: {plot_comparison(summary['runs'], out / 'comparison.png')}")
    _print_headline(summary)
    print(f"summary: {out / 'summary.json'}")
    return 0


def _print_headline(summary: dict) -> None:
    def show(value):
        return "n/a" if value is None else f"{value:.2f}"

    tail = summary["tail_extension_s"]
    print(
        f"\nacceptance length, mean of the last 3 steps: online {show(summary['acceptance_online_last3'])} vs "
        f"frozen {show(summary['acceptance_frozen_last3'])} "
        f"(ratio {show(summary['acceptance_ratio_online_vs_frozen'])}; frozen at step 1: "
        f"{show(summary['acceptance_frozen_first'])})"
    )
    for name, scores in summary["acceptance_by_strategy_last3"].items():
        print(
            f"  {name} steps only: online {show(scores['online'])} vs frozen {show(scores['frozen'])} "
            f"(ratio {show(scores['ratio'])})"
        )
    paired = summary["paired_est_acceptance_last3"]
    print(
        f"same samples (TLT run, teacher-forced estimate, last 3 steps): online {show(paired['online'])} vs "
        f"initial drafter {show(paired['frozen'])} (ratio {show(summary['paired_acceptance_ratio_online_vs_frozen'])}; "
        f"for keyed drafts {show(summary['paired_coupled_acceptance_ratio_online_vs_frozen'])})"
    )
    chain = summary["paired_chain_acceptance_last3"]
    print(
        f"  keyed chain of 4 from the drafter's own features (the engine's 4_1_4): online {show(chain['online'])} vs "
        f"initial drafter {show(chain['frozen'])}"
    )
    print(f"steps whose sampled responses equal the baseline's: {summary['steps_with_baseline_responses']}")
    print(
        f"rollout time TLT / baseline: {show(summary['rollout_time_ratio_tlt_vs_baseline'])} "
        f"(server-measured, all steps); step time TLT / baseline: {show(summary['step_time_ratio_tlt_vs_baseline'])}"
    )
    print(
        f"tail extension (last response -> replicas asleep), mean: baseline {show(tail['baseline_mean'])} s, "
        f"TLT {show(tail['tlt_mean'])} s; spot training ran on after the last response for at most "
        f"{show(tail['tlt_spot_overrun_max'])} s (one drafter step: {show(tail['drafter_step_s_max'])} s)"
    )
    print("decode ms per committed token by running batch size (plain / speculative steps):")
    print(format_decode_costs(summary["decode_ms_per_token_by_batch"]))
    print(
        f"idle replica-seconds {summary['idle_replica_s']:.1f}, of which used for drafter training "
        f"{100 * summary['idle_share_used_for_training']:.0f}%; wall time per run: {summary['wall_s']}"
    )
