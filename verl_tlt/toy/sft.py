"""SFT the toy world's tiny model into a *partly* trained `csub` target, and cache it (`toy/evaluate.py` scores it).

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
    prompt_text,
    sample_problem,
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


def read_training_info(path: str | Path) -> dict[str, Any] | None:
    """The `training.json` a checkpoint was saved with, or None for a checkpoint from elsewhere."""
    info = Path(path) / TRAINING_INFO_NAME
    return json.loads(info.read_text()) if info.is_file() else None
