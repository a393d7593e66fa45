"""Evaluate a toy target: accuracy by solution length, greedy and sampled, format validity, reward, entropy.

What `verl-tlt toy sft|eval` print, and how the cached target's training length was chosen: the target should write
the format reliably but solve long problems far less often than short ones, leaving RL room to improve.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from verl_tlt.metrics.long_tail import nearest_rank
from verl_tlt.progress import Progress
from verl_tlt.toy.sft import Example, collate, prompt_ids
from verl_tlt.toy.task import Problem, make_problems, parse_answer, response_num_tokens, score

# Step-count buckets of the evaluation report (inclusive bounds): the head, the body and the tail.
LENGTH_BUCKETS: tuple[tuple[int, int], ...] = ((1, 3), (4, 10), (11, 30), (31, 10**9))
# Evaluation problems come from their own stream, apart from every training seed's.
DEFAULT_EVAL_SEED = 20_250_101


def evaluate_toy_target(
    path: str | Path,
    num_problems: int = 500,
    seed: int = DEFAULT_EVAL_SEED,
    *,
    temperature: float = 1.0,
    max_new_tokens: int | None = None,
) -> dict[str, Any]:
    """Greedy and sampled accuracy (overall and per step-count bucket), format-valid rate, mean reward, mean
    next-token entropy of the target on its own samples, and sampled response lengths.

    Each response may use twice its reference length plus 16 tokens (capped by `max_new_tokens`, for quick
    smoke checks): a longer one cannot be right and would only cost time.

    "Format valid" means the response ends with `<eos>` and parses as a `csub` solution (the answer may be
    wrong). Entropy is token-weighted over response tokens, computed with transformers from the full
    next-token distribution at each sampled position. Generation uses the torch `RolloutEngine`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_tlt.engine import RolloutEngine, SamplingParams

    if num_problems < 1:
        raise ValueError(f"num_problems must be >= 1, got {num_problems}")
    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    problems = make_problems(num_problems, seed)
    prompts = prompt_ids(tokenizer, problems)
    engine = RolloutEngine.from_pretrained(str(path), seed=seed)
    start = time.perf_counter()
    budgets = [
        _max_tokens(p, len(ids), engine.max_model_len, max_new_tokens) for p, ids in zip(problems, prompts, strict=True)
    ]
    greedy_params = [SamplingParams(temperature=0.0, max_tokens=n) for n in budgets]
    sample_params = [
        SamplingParams(temperature=temperature, max_tokens=n, seed=seed * 1_000 + i) for i, n in enumerate(budgets)
    ]
    greedy = _generate(engine, tokenizer, problems, prompts, greedy_params, "greedy")
    sampled = _generate(engine, tokenizer, problems, prompts, sample_params, f"T={temperature:g}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    entropies = sequence_entropies(model, prompts, [s["token_ids"] for s in sampled], temperature)
    return {
        "path": str(path),
        "num_problems": num_problems,
        "seed": seed,
        "temperature": temperature,
        "greedy": _summary(greedy),
        "sampled": {**_summary(sampled), **_entropy_summary(entropies), **_length_summary(sampled)},
        "buckets": _bucket_rows(problems, greedy, sampled, entropies),
        "eval_wall_s": round(time.perf_counter() - start, 1),
    }


def _generate(
    engine: Any,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    prompts: Sequence[list[int]],
    params: Sequence[Any],
    label: str,
) -> list[dict[str, Any]]:
    """Generate one response per problem and score it."""
    progress = Progress(f"toy target eval, {label} answers", len(prompts), unit="answers")
    outputs = engine.generate(prompts, params, progress=progress)
    results = []
    for problem, output in zip(problems, outputs, strict=True):
        text = tokenizer.decode(output.token_ids, skip_special_tokens=True)
        ended = output.finish_reason == "stop"
        results.append(
            {
                "token_ids": list(output.token_ids),
                "format_valid": ended and parse_answer(text) is not None,
                "correct": ended and parse_answer(text) == problem.answer,
                "reward": score(text, problem.answer, problem),
            }
        )
    return results


def _max_tokens(problem: Problem, prompt_len: int, max_model_len: int, cap: int | None) -> int:
    limit = 2 * response_num_tokens(problem) + 16
    return max(1, min(limit, max_model_len - prompt_len, cap or limit))


@torch.inference_mode()
def sequence_entropies(
    model: torch.nn.Module,
    prompts: Sequence[list[int]],
    responses: Sequence[list[int]],
    temperature: float = 1.0,
    max_batch_tokens: int = 16_384,
) -> list[list[float]]:
    """Entropy (nats) of the model's next-token distribution at every response position, per sequence.

    The distribution is the one the response was sampled from (logits / temperature), so this is the model's
    uncertainty along its own trajectories.
    """
    examples = [Example(list(p), list(r)) for p, r in zip(prompts, responses, strict=True)]
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]))
    result: list[list[float]] = [[] for _ in examples]
    batch: list[int] = []
    for index in [*order, None]:
        full = index is None or (batch and (len(batch) + 1) * len(examples[index]) > max_batch_tokens)
        if full and batch:
            _batch_entropies(model, [examples[i] for i in batch], temperature, [result[i] for i in batch])
            batch = []
        if index is not None:
            batch.append(index)
    return result


def _batch_entropies(model: torch.nn.Module, batch: list[Example], temperature: float, out: list[list[float]]) -> None:
    input_ids, _ = collate(batch, pad_token_id=0)
    logits = model(input_ids=input_ids).logits.float() / max(temperature, 1e-5)
    log_probs = logits.log_softmax(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)  # [B, T]: entropy of the prediction for position t+1
    for row, example in enumerate(batch):
        first = len(example.prompt_ids) - 1
        out[row].extend(entropy[row, first : first + len(example.response_ids)].tolist())


def _summary(results: list[dict[str, Any]]) -> dict[str, float]:
    return {
        "accuracy": _mean([r["correct"] for r in results]),
        "format_valid": _mean([r["format_valid"] for r in results]),
        "mean_reward": _mean([r["reward"] for r in results]),
    }


def _entropy_summary(entropies: list[list[float]]) -> dict[str, float]:
    flat = [h for sequence in entropies for h in sequence]
    return {"mean_entropy_nats": _mean(flat), "max_entropy_nats": max(flat, default=float("nan"))}


def _length_summary(results: list[dict[str, Any]]) -> dict[str, float]:
    lengths = sorted(len(r["token_ids"]) for r in results)
    return {
        "response_tokens_p50": nearest_rank(lengths, 0.5),
        "response_tokens_p90": nearest_rank(lengths, 0.9),
        "response_tokens_max": lengths[-1],
    }


def _bucket_rows(
    problems: Sequence[Problem],
    greedy: list[dict[str, Any]],
    sampled: list[dict[str, Any]],
    entropies: list[list[float]],
) -> list[dict[str, Any]]:
    rows = []
    for low, high in LENGTH_BUCKETS:
        members = [i for i, p in enumerate(problems) if low <= p.num_steps <= high]
        rows.append(
            {
                "steps": f"{low}-{high}" if high < 10**9 else f"{low}+",
                "num": len(members),
                "greedy_accuracy": _mean([greedy[i]["correct"] for i in members]),
                "sampled_accuracy": _mean([sampled[i]["correct"] for i in members]),
                "sampled_format_valid": _mean([sampled[i]["format_valid"] for i in members]),
                "sampled_mean_entropy_nats": _mean([h for i in members for h in entropies[i]]),
            }
        )
    return rows


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def format_report(report: dict[str, Any]) -> str:
    """A readable table of an `evaluate_toy_target` report (used by `verl-tlt toy sft|eval`)."""
    greedy, sampled = report["greedy"], report["sampled"]
    lines = [
        f"toy target {report['path']}",
        f"{report['num_problems']} problems (seed {report['seed']}), sampled at T={report['temperature']}",
        "",
        f"{'steps':>7} {'n':>5} {'greedy acc':>10} {'sampled acc':>11} {'format':>7} {'entropy':>9}",
    ]
    for row in report["buckets"]:
        lines.append(
            f"{row['steps']:>7} {row['num']:>5} {row['greedy_accuracy']:>10.3f} {row['sampled_accuracy']:>11.3f} "
            f"{row['sampled_format_valid']:>7.3f} {row['sampled_mean_entropy_nats']:>9.4f}"
        )
    lines.append(
        f"{'all':>7} {report['num_problems']:>5} {greedy['accuracy']:>10.3f} {sampled['accuracy']:>11.3f} "
        f"{sampled['format_valid']:>7.3f} {sampled['mean_entropy_nats']:>9.4f}"
    )
    lines += [
        "",
        f"format valid: greedy {greedy['format_valid']:.3f}, sampled {sampled['format_valid']:.3f}",
        f"mean reward (with partial credit): greedy {greedy['mean_reward']:.3f}, sampled {sampled['mean_reward']:.3f}",
        f"sampled response tokens p50/p90/max: {sampled['response_tokens_p50']}/"
        f"{sampled['response_tokens_p90']}/{sampled['response_tokens_max']}",
        f"mean next-token entropy on own samples: {sampled['mean_entropy_nats']:.4f} nats/token",
    ]
    training = report.get("training")
    if training:
        lines.append(
            f"training: {training['num_steps']} steps, {training['wall_s']:.0f} s, "
            f"{training['tokens_per_s']:.0f} tokens/s, final loss {training['losses'][-1]['loss']:.4f}"
        )
    return "\n".join(lines)
