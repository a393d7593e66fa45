"""A model's base pass rate on the real tasks, how often a GRPO group's rewards differ, and its response lengths.

What `verl-tlt tasks eval` prints and how the task difficulties in `registry.py` were chosen: GRPO learns only from
groups whose rewards are not all equal, and TLT's tail is the spread of response lengths. The problems are the
validation split's (`verl-tlt tasks write`), scored by the reward function's own rule; generation uses the torch
`RolloutEngine` with the model's chat template.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_tlt.chat import chat_prompt_ids
from verl_tlt.metrics.long_tail import nearest_rank
from verl_tlt.progress import Progress
from verl_tlt.tasks.answers import chat_prompt
from verl_tlt.tasks.dataset import VAL_SEED_OFFSET
from verl_tlt.tasks.problems import Problem, generate
from verl_tlt.tasks.scoring import score_response

DEFAULT_SEED = 0  # the seed `verl-tlt tasks write` uses by default: its validation split is what is evaluated


def evaluate_tasks(
    model_path: str | Path,
    tasks: Sequence[str],
    *,
    num_problems: int = 16,
    group_size: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    seed: int = DEFAULT_SEED,
    max_num_seqs: int = 32,
) -> dict[str, Any]:
    """Per task: greedy and sampled pass rate, the share of groups (`group_size` samples of one problem) whose
    rewards differ, and sampled response tokens p50/p90/max with the share cut at `max_new_tokens`."""
    from transformers import AutoTokenizer

    from verl_tlt.engine import RolloutEngine, SamplingParams

    if num_problems < 1 or group_size < 1 or max_new_tokens < 1:
        raise ValueError(
            f"num_problems, group_size and max_new_tokens must be >= 1, got {num_problems}, {group_size}, "
            f"{max_new_tokens}"
        )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    problems = {
        task: generate(task, seed + VAL_SEED_OFFSET + number, num_problems) for number, task in enumerate(tasks)
    }
    flat = [problem for task in tasks for problem in problems[task]]
    prompts = [chat_prompt_ids(tokenizer, chat_prompt(problem.question)) for problem in flat]
    # The KV cache is sized for these prompts and answers only, not the model's whole context (8k for SmolLM2).
    engine = RolloutEngine.from_pretrained(
        str(model_path), max_num_seqs=max_num_seqs, max_model_len=max(map(len, prompts)) + max_new_tokens, seed=seed
    )
    start = time.perf_counter()
    greedy_params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    greedy = _answers(engine, tokenizer, flat, prompts, [greedy_params] * len(flat), "greedy answers")
    sample_params = [
        SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=seed * 1_000_003 + i)
        for i in range(len(flat) * group_size)
    ]
    repeated = [problem for problem in flat for _ in range(group_size)]
    sampled = _answers(
        engine,
        tokenizer,
        repeated,
        [ids for ids in prompts for _ in range(group_size)],
        sample_params,
        f"T={temperature:g} answers",
    )
    rows, at = [], 0
    for task in tasks:
        count = len(problems[task])
        task_greedy = greedy[at : at + count]
        task_sampled = sampled[at * group_size : (at + count) * group_size]
        groups = [task_sampled[g * group_size : (g + 1) * group_size] for g in range(count)]
        rows.append(
            {
                "task": task,
                "problems": count,
                "greedy_pass": _mean([a["reward"] for a in task_greedy]),
                "sampled_pass": _mean([a["reward"] for a in task_sampled]),
                "varied_groups": _mean([len({a["reward"] for a in group}) > 1 for group in groups]),
                "truncated": _mean([a["truncated"] for a in task_sampled]),
                **length_quantiles([a["tokens"] for a in task_sampled]),
            }
        )
        at += count
    return {
        "model": str(model_path),
        "seed": seed,
        "group_size": group_size,
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "tasks": rows,
        "all": {
            "greedy_pass": _mean([a["reward"] for a in greedy]),
            "sampled_pass": _mean([a["reward"] for a in sampled]),
            **length_quantiles([a["tokens"] for a in sampled]),
        },
        "wall_s": round(time.perf_counter() - start, 1),
    }


def _answers(
    engine: Any, tokenizer: Any, problems: Sequence[Problem], prompts: Sequence[list[int]], params, label: str
) -> list[dict[str, Any]]:
    progress = Progress(label, len(prompts), unit="answers")
    outputs = engine.generate(prompts, params, progress=progress)
    answers = []
    for problem, output in zip(problems, outputs, strict=True):
        text = tokenizer.decode(output.token_ids, skip_special_tokens=True)
        reward = score_response(problem.task, problem.seed, problem.size, problem.index, text, problem.answer)
        answers.append(
            {"reward": reward, "tokens": len(output.token_ids), "truncated": output.finish_reason == "length"}
        )
    return answers


def length_quantiles(lengths: Sequence[int]) -> dict[str, int]:
    """Nearest-rank p50 and p90 and the maximum of response lengths (tokens)."""
    ordered = sorted(lengths)
    if not ordered:
        raise ValueError("no responses to measure")
    return {
        "tokens_p50": nearest_rank(ordered, 0.5),
        "tokens_p90": nearest_rank(ordered, 0.9),
        "tokens_max": ordered[-1],
    }


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def format_report(report: dict[str, Any]) -> str:
    """The table `verl-tlt tasks eval` prints."""
    lines = [
        f"model {report['model']}: greedy, and {report['group_size']} samples per problem at "
        f"T={report['temperature']:g}, up to {report['max_new_tokens']} tokens",
        "",
        f"{'task':<18} {'n':>4} {'greedy':>7} {'sampled':>8} {'varied':>7} {'cut':>5} {'p50':>5} {'p90':>5} {'max':>5}",
    ]
    for row in report["tasks"]:
        lines.append(
            f"{row['task']:<18} {row['problems']:>4} {row['greedy_pass']:>7.3f} {row['sampled_pass']:>8.3f} "
            f"{row['varied_groups']:>7.3f} {row['truncated']:>5.2f} {row['tokens_p50']:>5} {row['tokens_p90']:>5} "
            f"{row['tokens_max']:>5}"
        )
    every = report["all"]
    lines += [
        f"{'all':<18} {'':>4} {every['greedy_pass']:>7.3f} {every['sampled_pass']:>8.3f} {'':>7} {'':>5} "
        f"{every['tokens_p50']:>5} {every['tokens_p90']:>5} {every['tokens_max']:>5}",
        "",
        "varied: share of groups whose rewards are not all equal (what GRPO learns from); cut: share of samples "
        f"stopped at the token limit; p50/p90/max: sampled response tokens; {report['wall_s']:.0f} s of generation",
    ]
    return "\n".join(lines)
