"""The CPU quickstart: build the toy world, run a few verl GRPO steps with the torch rollout, summarise them.

`recipes/quickstart_cpu.sh` runs this (after setting up the virtualenv); `verl-tlt quickstart` is the same.
The actor starts from the SFT toy target (`verl_tlt.toy.sft`), which writes the response format but solves only
part of the problems, so the reward has room to rise; it is trained once (a few CPU minutes) and cached.
Writes `outputs/quickstart/summary.json` with one row per step: wall time, rollout time, response-length
percentiles (tokens, from verl's rollout dumps) and mean reward.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
from pathlib import Path

from verl_tlt.verl_job import JobResult, read_rollouts, run_verl_job

logger = logging.getLogger(__name__)

DEFAULT_CACHE = Path(os.environ.get("VERL_TLT_CACHE", Path.home() / ".cache" / "verl-tlt"))


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
) -> list[str]:
    """verl overrides for GRPO on the toy world on CPU (everything platform-specific comes from +cpu=torch).

    model_dir: the actor's initial weights (default: the world's untrained model), e.g. the SFT toy target.
    """
    mini_batch = batch_size
    micro_batch = batch_size * group_size
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
        "trainer.save_freq=-1",
        f"trainer.total_training_steps={steps}",
        "trainer.project_name=verl_tlt_quickstart",
        "trainer.experiment_name=toy_grpo",
    ]


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


def percentile(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))])


def summarize(result: JobResult, tokenizer) -> list[dict]:
    """One row per step from verl's metrics and rollout dumps."""
    rows = []
    for metrics in result.metrics:
        step = metrics["step"]
        # verl dumps decoded text without special tokens; +1 counts the EOS a finished response ends with.
        lengths = [
            len(tokenizer.encode(s["output"], add_special_tokens=False))
            for s in read_rollouts(result.rollout_dump_dir, step)
        ]
        rows.append(
            {
                "step": step,
                "wall_time_s": round(metrics.get("timing_s/step", float("nan")), 3),
                "rollout_time_s": round(metrics.get("timing_s/gen", float("nan")), 3),
                "response_tokens_p50": percentile(lengths, 0.5),
                "response_tokens_p90": percentile(lengths, 0.9),
                "response_tokens_max": float(max(lengths)) if lengths else float("nan"),
                "reward_mean": round(metrics.get("critic/score/mean", float("nan")), 4),
                "grad_norm": round(metrics.get("actor/grad_norm", float("nan")), 4),
                "rollout_probs_diff_max": metrics.get("training/rollout_probs_diff_max"),
            }
        )
    return rows


def format_table(rows: list[dict]) -> str:
    header = f"{'step':>4} {'wall s':>7} {'rollout s':>9} {'len p50':>7} {'len p90':>7} {'len max':>7} {'reward':>7}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['step']:>4} {r['wall_time_s']:>7.2f} {r['rollout_time_s']:>9.2f} "
            f"{r['response_tokens_p50']:>7.0f} {r['response_tokens_p90']:>7.0f} "
            f"{r['response_tokens_max']:>7.0f} {r['reward_mean']:>7.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verl-tlt quickstart", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/quickstart", help="output directory (summary.json, logs)")
    parser.add_argument(
        "--cache", default=str(DEFAULT_CACHE), help="where the toy world and the SFT toy target are built and reused"
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4, help="GRPO samples per prompt (rollout.n)")
    parser.add_argument("--max-response-length", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--timeout", type=float, default=900, help="hard limit for the verl job, seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[quickstart] %(message)s")

    from verl_tlt.toy.build import build_toy_world
    from verl_tlt.toy.sft import ensure_toy_target
    from verl_tlt.toy.tokenizer import build_tokenizer

    world = build_toy_world(Path(args.cache) / "toy-world")
    logger.info("toy world: %s", world.root)
    target = ensure_toy_target(args.cache)
    check_same_tokenizer(world.model_dir, target)
    logger.info("actor: SFT toy target %s", target)
    overrides = toy_grpo_overrides(
        world,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_response_length=args.max_response_length,
        lr=args.lr,
        model_dir=target,
    )
    result = run_verl_job(overrides, args.out, timeout_s=args.timeout)
    rows = summarize(result, build_tokenizer())
    summary = {
        "job": "toy GRPO on CPU, torch rollout",
        "wall_s": round(result.wall_s, 1),
        "steps": rows,
        "overrides": overrides,
    }
    out = Path(args.out) / "summary.json"
    out.write_text(json.dumps(summary, indent=2))
    print(format_table(rows))
    print(
        f"\nverl job: {result.wall_s:.0f} s wall (incl. Ray/verl start-up); "
        f"mean step {statistics.mean(r['wall_time_s'] for r in rows):.2f} s. Summary: {out}"
    )
    return 0
