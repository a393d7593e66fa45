"""`verl-tlt bench drafter-replay`: a drafter-training recipe replayed on a recorded RL run's data.

A TLT run with `tlt.drafter.record_dir` saves every step's captured samples and the policy's shared weights
(`verl_tlt.drafter.capture_record`). This replays the run's online drafter training step by step, as the TLT
trainer orders it: at step s the drafter trains on what was captured before s (the spot training of rollout s,
against the policy that generated it), is then scored together with the initial, frozen drafter on step s's fresh
samples (the teacher-forced estimate the run logs as `tlt/drafter/eval_*`), and step s's samples join the buffer.
The drafter that rollout s decoded with is the one from before that burst (it is synced after the step), so it is
scored before the burst too (`rollout_*`): that is the drafter whose acceptance the rollout shows.

The training budget per step is a number of optimizer steps (what a run did: its `tlt/drafter/total_steps`), so
recipes are compared on the same data and the same number of updates; each step's time is reported, since a
cheaper step buys more steps in a run's idle time.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from verl_tlt.config import DrafterConfig
from verl_tlt.drafter.capture_record import RecordedStep, load_steps
from verl_tlt.drafter.data import DrafterDataBuffer
from verl_tlt.drafter.evaluate import evaluate_drafter
from verl_tlt.drafter.family import drafter_from_init
from verl_tlt.drafter.trainer import DrafterTrainer
from verl_tlt.files import write_json
from verl_tlt.progress import Progress

# The quickstart's headline averages the last 3 steps.
LAST_STEPS = 3
# evaluate_drafter's acceptance-length estimates (online / frozen per step, and the last steps' ratio): greedy drafts
# at depth 1 extrapolated, keyed drafts at depth 1 extrapolated, and the keyed chain drafted from its own features.
METRICS = ("est_acceptance_length", "est_coupled_acceptance_length", "chain_acceptance_length")
SHORT = {
    "est_acceptance_length": "greedy est",
    "est_coupled_acceptance_length": "keyed est",
    "chain_acceptance_length": "keyed chain",
}


def _per_step_budget(steps_per_rl_step: list[int], num_steps: int) -> list[int]:
    """One budget per recorded step: a single number for all, or one per step."""
    if len(steps_per_rl_step) == 1:
        return steps_per_rl_step * num_steps
    if len(steps_per_rl_step) != num_steps:
        raise ValueError(
            f"--steps-per-rl-step takes one number, or one per recorded step ({num_steps}); got "
            f"{len(steps_per_rl_step)}"
        )
    return list(steps_per_rl_step)


def replay(
    steps: list[RecordedStep],
    target_path: str,
    drafter_init: str,
    train_config: DrafterConfig,
    steps_per_rl_step: list[int],
) -> dict:
    """Replay online training over `steps`; per-step scores of the online and the initial drafter, and totals.

    train_config: the run's `tlt.drafter` recipe (with the buffer size of its drafter workers) or one to compare.
    """
    from verl_tlt.modeling.weights import load_pretrained, load_weights

    budget = _per_step_budget(steps_per_rl_step, len(steps))
    eval_tokens = train_config.max_tokens_per_batch  # as a drafter worker scores: packed like its training batches
    target, _ = load_pretrained(target_path, dtype=torch.float32)
    target.requires_grad_(False)
    # The initial policy's weights that the drafter shares, for steps recorded before the first weight push.
    initial_shared = {name: view.clone() for name, view in target.drafter_shared_views().items()}
    model = drafter_from_init(drafter_init, target)
    frozen = drafter_from_init(drafter_init, target)
    frozen.requires_grad_(False)
    trainer = DrafterTrainer(model, DrafterDataBuffer(train_config.buffer_tokens), train_config)
    progress = Progress("bench drafter-replay", len(steps), unit="recorded steps")
    rows = []
    for record, max_steps in zip(steps, budget, strict=True):
        shared = record.shared_weights if record.shared_weights is not None else initial_shared
        load_weights(target, shared.items(), strict=False)
        # The drafter this step's rollout decoded with: trained through the step before (what its acceptance shows).
        in_rollout = evaluate_drafter(model, record.samples, eval_tokens)
        report = trainer.train(max_steps=max_steps) if max_steps > 0 else None
        online = evaluate_drafter(model, record.samples, eval_tokens) if report is not None else in_rollout
        initial = evaluate_drafter(frozen, record.samples, eval_tokens)
        trainer.add_samples(record.samples)
        row = {
            "step": record.step,
            "samples": len(record.samples),
            "tokens": sum(s.num_tokens for s in record.samples),
            "train_steps": report.steps if report else 0,
            "train_s": round(report.seconds, 3) if report else 0.0,
        }
        for metric in (*METRICS, "top1_accuracy"):
            row[f"online_{metric}"], row[f"frozen_{metric}"] = online.get(metric), initial.get(metric)
            row[f"rollout_{metric}"] = in_rollout.get(metric)
        rows.append(row)
        progress.advance(extra=f"step {record.step}, {row['train_steps']} optimizer steps")
    last = rows[-LAST_STEPS:]
    trained = [r for r in rows if r["train_steps"]]
    summary = {}
    for metric in METRICS:
        online_last = sum(r[f"online_{metric}"] for r in last) / len(last)
        frozen_last = sum(r[f"frozen_{metric}"] for r in last) / len(last)
        rollout_last = sum(r[f"rollout_{metric}"] for r in last) / len(last)
        summary[metric] = {
            "online": online_last,
            "frozen": frozen_last,
            "ratio": online_last / frozen_last,
            "rollout_online": rollout_last,
            "rollout_ratio": rollout_last / frozen_last,
        }
    return {
        "train_config": dataclasses.asdict(train_config),
        "rows": rows,
        "last3": summary,
        "train_steps": sum(r["train_steps"] for r in rows),
        "step_s_mean": sum(r["train_s"] for r in trained) / max(1, sum(r["train_steps"] for r in trained)),
    }


def run(
    json_path: str | None,
    record_dir: str,
    target_path: str,
    drafter_init: str,
    train_config: DrafterConfig,
    steps_per_rl_step: list[int],
    *,
    threads: int = 1,
) -> dict:
    steps = load_steps(record_dir)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    start = time.perf_counter()
    try:
        result = replay(steps, target_path, drafter_init, train_config, steps_per_rl_step)
    finally:
        torch.set_num_threads(previous_threads)
    result.update({"record_dir": record_dir, "target": target_path, "drafter": drafter_init, "threads": threads})
    result["wall_s"] = round(time.perf_counter() - start, 1)
    print("step  tokens  train_steps  train_s  " + "  ".join(f"{SHORT[m]:>17}" for m in METRICS))
    for row in result["rows"]:
        scores = "  ".join(f"{row[f'online_{m}']:8.3f}/{row[f'frozen_{m}']:<8.3f}" for m in METRICS)
        print(f"{row['step']:4d}  {row['tokens']:6d}  {row['train_steps']:11d}  {row['train_s']:7.2f}  {scores}")
    print(f"last {LAST_STEPS} steps, online vs frozen drafter (acceptance length estimates):")
    for metric, scores in result["last3"].items():
        print(
            f"  {metric}: {scores['online']:.3f} vs {scores['frozen']:.3f} (ratio {scores['ratio']:.3f}); the "
            f"drafter the rollout used (one burst older) {scores['rollout_online']:.3f} (ratio "
            f"{scores['rollout_ratio']:.3f})"
        )
    print(f"{result['train_steps']} optimizer steps, {result['step_s_mean'] * 1000:.0f} ms each on {threads} thread(s)")
    if json_path:
        write_json(json_path, result)
    return result
