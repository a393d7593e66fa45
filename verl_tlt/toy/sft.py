"""SFT the toy world's tiny model into a *partly* trained `csub` target, evaluate it, and cache it.

Why a trained target: a randomly initialised model never writes the response format, so RL on it shows no
reward and its rollouts have no long tail. Why only partly trained: a converged target (~99% accuracy, entropy
~0.002 nats/token) leaves RL nothing to improve and makes speculative decoding unrealistically
easy. `DEFAULT_NUM_STEPS` is chosen so the target almost always writes well-formed, eos-terminated responses
but solves short problems far more often than long ones.

The recipe: fp32, AdamW (lr 3e-3, betas (0.9, 0.98), wd 0.01), grad
clip 1.0, linear warm-up then cosine decay to 10%, fresh synthetic problems for every batch, length-bucketed
batches of at most 4,096 padded tokens, loss on the response and `<eos>` only. The schedule is driven by the
step count, not wall time, so a seed gives the same weights however fast the machine is (bit-identical with 1
and 2 threads on one torch build and CPU; other CPUs or builds may differ in the last bits, then drift a little).

The checkpoint is a plain transformers directory (config, safetensors, the toy tokenizer files), loadable by
transformers, `RolloutEngine.from_pretrained` and verl. `ensure_toy_target` trains it once into
`<cache>/toy-target-v<TOY_TARGET_VERSION>-seed<seed>` and reuses it afterwards.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from verl_tlt.files import write_json
from verl_tlt.progress import Progress
from verl_tlt.toy.cache import build_once, default_cache_root
from verl_tlt.toy.model import build_tiny_model, shape_kwargs
from verl_tlt.toy.task import (
    COMPACT,
    STANDARD,
    Problem,
    make_problems,
    parse_answer,
    prompt_text,
    response_num_tokens,
    sample_problem,
    score,
    solution_text,
)
from verl_tlt.toy.tokenizer import build_tokenizer

logger = logging.getLogger(__name__)

# Bump when the recipe, the data stream or DEFAULT_NUM_STEPS changes: cached targets of an older version are
# then ignored (and retrained) instead of silently reused.
TOY_TARGET_VERSION = 1
# Share of compact-style SFT examples in the drifting target (the quickstart's actor, and what the drafter-replay
# bench replays by default): rare enough that a drafter warmed up on the target mostly sees the standard style, so
# RL's move towards the compact one is a drift the drafter must follow.
DRIFTING_COMPACT_SHARE = 0.1
# Optimizer steps of the cached target: 1.26M tokens, ~80 s on 2 idle cores (15.5k tokens/s). Measured with
# seed 0 on 500 held-out problems, T=1 samples: 300 steps -> 34% accuracy but only 88% well-formed; 350 -> 50%
# / 90%; 400 -> 64% / 94% (1-3 steps 73%, 31+ steps 8%; 0.11 nats/token); 500 -> 80% / 97%, most of the room
# for RL gone.
DEFAULT_NUM_STEPS = 400
# Written last into a checkpoint: training statistics, and the marker of a complete directory.
TRAINING_INFO_NAME = "training.json"
_CHECKPOINT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json")
# Step-count buckets of the evaluation report (inclusive bounds): the head, the body and the tail.
LENGTH_BUCKETS: tuple[tuple[int, int], ...] = ((1, 3), (4, 10), (11, 30), (31, 10**9))
# Evaluation problems come from their own stream, apart from every training seed's.
DEFAULT_EVAL_SEED = 20_250_101
_TRAIN_SEED_OFFSET = 7_919
_STYLE_SEED_OFFSET = 104_729
_IGNORE_INDEX = -100


@dataclass(frozen=True)
class SFTRecipe:
    """Optimisation settings of the toy target; anything changed here for the cached target needs a version bump."""

    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    max_batch_tokens: int = 4096
    # Problems drawn at once and sorted by length into batches; large enough for batches of similar length.
    pool_size: int = 512
    # Share of examples written in the compact style (task.COMPACT); 0 = the standard style only. Style choices
    # come from their own random stream, so 0 leaves the data stream of the cached standard target unchanged.
    compact_share: float = 0.0

    def __post_init__(self) -> None:
        if self.max_batch_tokens < 64:
            raise ValueError(f"max_batch_tokens must be >= 64, got {self.max_batch_tokens}")
        if self.warmup_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"need warmup_steps >= 0 and 0 <= min_lr_ratio <= 1, got {self}")
        if not 0.0 <= self.compact_share <= 1.0:
            raise ValueError(f"compact_share must be in [0, 1], got {self.compact_share}")


@dataclass(frozen=True)
class Example:
    """One tokenised SFT example: the prompt as verl renders it, then the reference response and `<eos>`."""

    prompt_ids: list[int]
    response_ids: list[int]

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


# ----- data ---------------------------------------------------------------------------------------------------


def render_prompt(tokenizer: PreTrainedTokenizerBase, problem: Problem) -> str:
    """The prompt text exactly as verl's RLHFDataset renders it (chat template + generation prompt)."""
    messages = [{"role": "user", "content": prompt_text(problem)}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem]) -> list[list[int]]:
    """Token ids of the rendered prompts (the template already holds the special tokens)."""
    texts = [render_prompt(tokenizer, p) for p in problems]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def encode_examples(
    tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem], styles: Sequence[str] | None = None
) -> list[Example]:
    """Prompt ids and reference-response ids (plus `<eos>`, so the target learns to stop) per problem.

    styles: the solution style of each problem (default: all standard)."""
    styles = styles or [STANDARD] * len(problems)
    texts = [solution_text(p, style) for p, style in zip(problems, styles, strict=True)]
    responses = tokenizer(texts, add_special_tokens=False)["input_ids"]
    prompts, eos = prompt_ids(tokenizer, problems), tokenizer.eos_token_id
    return [Example(prompt, response + [eos]) for prompt, response in zip(prompts, responses, strict=True)]


def pack_by_length(examples: list[Example], max_batch_tokens: int) -> list[list[Example]]:
    """Group examples, shortest first, into batches whose padded size (rows x longest) fits the budget.

    Sorting first keeps padding low, which matters because the long tail would otherwise pad every batch to
    hundreds of tokens.
    """
    batches: list[list[Example]] = []
    current: list[Example] = []
    for example in sorted(examples, key=len):
        if len(example) > max_batch_tokens:
            raise ValueError(f"an example of {len(example)} tokens exceeds max_batch_tokens={max_batch_tokens}")
        if current and (len(current) + 1) * len(example) > max_batch_tokens:
            batches.append(current)
            current = []
        current.append(example)
    if current:
        batches.append(current)
    return batches


def batch_stream(tokenizer: PreTrainedTokenizerBase, seed: int, recipe: SFTRecipe) -> Iterator[list[Example]]:
    """An endless, seeded stream of length-bucketed batches of freshly sampled problems (no epochs, no reuse)."""
    rng = random.Random(seed + _TRAIN_SEED_OFFSET)
    style_rng = random.Random(seed + _STYLE_SEED_OFFSET)
    while True:
        problems = [sample_problem(rng) for _ in range(recipe.pool_size)]
        styles = None
        if recipe.compact_share > 0:
            styles = [COMPACT if style_rng.random() < recipe.compact_share else STANDARD for _ in problems]
        batches = pack_by_length(encode_examples(tokenizer, problems, styles), recipe.max_batch_tokens)
        rng.shuffle(batches)
        yield from batches


def collate(batch: list[Example], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and next-token labels (ignore-index on the prompt and padding)."""
    width = max(len(e) for e in batch)
    input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(batch), width), _IGNORE_INDEX, dtype=torch.long)
    for row, example in enumerate(batch):
        ids = example.prompt_ids + example.response_ids
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, len(example.prompt_ids) : len(ids)] = torch.tensor(example.response_ids)
    return input_ids, labels


# ----- training -----------------------------------------------------------------------------------------------


def lr_factor(step: int, num_steps: int, recipe: SFTRecipe) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based): linear warm-up, then cosine to the floor."""
    if step < recipe.warmup_steps:
        return (step + 1) / recipe.warmup_steps
    decay_steps = max(num_steps - recipe.warmup_steps, 1)
    progress = min((step - recipe.warmup_steps) / decay_steps, 1.0)
    return recipe.min_lr_ratio + (1.0 - recipe.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def response_loss(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over labelled (response + eos) positions.

    No attention mask: padding is on the right and causal attention never lets a real token see it.
    """
    logits = model(input_ids=input_ids).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=_IGNORE_INDEX)


def train_steps(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    *,
    num_steps: int,
    seed: int,
    recipe: SFTRecipe,
    log_every: int = 50,
) -> dict[str, Any]:
    """Run `num_steps` optimizer steps in place; returns statistics (loss per log interval, tokens/s).

    Reports progress (loss of the current interval, lr, tokens/s) through `verl_tlt.progress`.
    """
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe.lr, betas=recipe.betas, weight_decay=recipe.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, num_steps, recipe))
    stream = batch_stream(tokenizer, seed, recipe)
    model.train()
    progress = Progress("toy SFT", num_steps)
    start = time.perf_counter()
    losses: list[dict[str, float]] = []
    interval_loss, interval_steps, tokens, padded_tokens = 0.0, 0, 0, 0
    for step in range(num_steps):
        input_ids, labels = collate(next(stream), tokenizer.pad_token_id)
        loss = response_loss(model, input_ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        interval_loss, interval_steps = interval_loss + loss.item(), interval_steps + 1
        tokens += int((input_ids != tokenizer.pad_token_id).sum())
        padded_tokens += input_ids.numel()
        rate = tokens / (time.perf_counter() - start)
        extra = f"loss {interval_loss / interval_steps:.4f}, lr {scheduler.get_last_lr()[0]:.2e}, {rate:.0f} tokens/s"
        progress.update(step + 1, extra)
        if (step + 1) % log_every == 0 or step + 1 == num_steps:
            losses.append({"step": step + 1, "loss": interval_loss / interval_steps})
            interval_loss, interval_steps = 0.0, 0
    model.eval()
    wall_s = time.perf_counter() - start
    return {
        "losses": losses,
        "wall_s": round(wall_s, 2),
        "tokens": tokens,
        "padded_tokens": padded_tokens,
        "tokens_per_s": round(tokens / wall_s, 1),
    }


def train_toy_target(
    out_dir: str | Path,
    seed: int = 0,
    num_steps: int = DEFAULT_NUM_STEPS,
    *,
    recipe: SFTRecipe | None = None,
    num_threads: int | None = None,
    log_every: int = 50,
    shape: str = "default",
) -> Path:
    """SFT the toy world's model (same init as `build_toy_world(seed=seed)`) and save it to `out_dir`.

    `out_dir` must be empty or absent. Writes a transformers checkpoint plus `training.json` (recipe, loss
    curve, wall time, tokens/s). num_threads: torch intra-op threads for the run (default: torch's choice).
    shape: a name from `verl_tlt.toy.model.TOY_SHAPES`.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"refusing to train into non-empty {out_dir}; pass an empty or new directory")
    recipe = recipe or SFTRecipe()
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, **shape_kwargs(shape))
    logger.info("Training the toy target: %d steps, seed %d, %s parameters", num_steps, seed, model.num_parameters())
    previous_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        stats = train_steps(model, tokenizer, num_steps=num_steps, seed=seed, recipe=recipe, log_every=log_every)
    finally:
        torch.set_num_threads(previous_threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {
        "version": TOY_TARGET_VERSION,
        "seed": seed,
        "shape": shape,
        "num_steps": num_steps,
        "recipe": asdict(recipe),
        "num_threads": torch.get_num_threads() if num_threads is None else num_threads,
        "torch": torch.__version__,
        **stats,
    }
    write_json(out_dir / TRAINING_INFO_NAME, info)
    logger.info("Saved the toy target to %s (%.0f s, %.0f tokens/s)", out_dir, stats["wall_s"], stats["tokens_per_s"])
    return out_dir


# ----- cache --------------------------------------------------------------------------------------------------


def target_dir_name(
    seed: int, num_steps: int = DEFAULT_NUM_STEPS, compact_share: float = 0.0, shape: str = "default"
) -> str:
    """Cache folder name; a non-default step count, style mix or shape gets its own folder so it never shadows
    the real target."""
    name = f"toy-target-v{TOY_TARGET_VERSION}-seed{seed}"
    if num_steps != DEFAULT_NUM_STEPS:
        name += f"-steps{num_steps}"
    if compact_share > 0:
        name += f"-compact{compact_share:g}"
    if shape != "default":
        name += f"-{shape}"
    return name


def ensure_toy_target(
    cache_root: str | Path | None = None,
    *,
    seed: int = 0,
    num_steps: int = DEFAULT_NUM_STEPS,
    recipe: SFTRecipe | None = None,
    compact_share: float = 0.0,
    shape: str = "default",
) -> Path:
    """Path of the cached trained target, training it once (~1.5 min on 2 idle cores) if it is missing.

    compact_share: share of SFT examples in the compact style (the quickstart's drifting target uses 0.1).
    shape: a name from `verl_tlt.toy.model.TOY_SHAPES` (checked before anything is trained).

    Training goes to a temporary folder next to the cache entry, renamed into place when complete, so a killed
    run never leaves a half-written target; a file lock makes concurrent callers wait for one training run.
    `recipe` is for tests only: the folder name records the version, seed and steps, not the recipe.
    """
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    shape_kwargs(shape)

    recipe = recipe or SFTRecipe()
    if compact_share:
        recipe = replace(recipe, compact_share=compact_share)

    def train(out_dir: Path) -> None:
        train_toy_target(out_dir, seed=seed, num_steps=num_steps, recipe=recipe, shape=shape)

    name = target_dir_name(seed, num_steps, recipe.compact_share, shape)
    return build_once(root / name, _is_complete, train, "toy target")


def _is_complete(target: Path) -> bool:
    return all((target / name).is_file() for name in (*_CHECKPOINT_FILES, TRAINING_INFO_NAME))


# ----- evaluation ---------------------------------------------------------------------------------------------


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
    nearest_rank = lambda q: lengths[max(math.ceil(q * len(lengths)) - 1, 0)]  # noqa: E731
    return {
        "response_tokens_p50": nearest_rank(0.5),
        "response_tokens_p90": nearest_rank(0.9),
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


def read_training_info(path: str | Path) -> dict[str, Any] | None:
    """The `training.json` a checkpoint was saved with, or None for a checkpoint from elsewhere."""
    info = Path(path) / TRAINING_INFO_NAME
    return json.loads(info.read_text()) if info.is_file() else None
