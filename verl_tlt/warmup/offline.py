"""Offline drafter warm-up: the target generates answers to a prompt set, its hidden states and sparse next-token
distributions are recorded, and an EAGLE drafter trains on them, so an RL run starts from a drafter that already
agrees with its policy.

A warm-up keeps to a time budget (collection included), checkpoints its training every few minutes beside the
output (`<out>.warmup-state/`: model, optimizer, step, data cursor) and exports the drafter at every checkpoint, so
an interrupted run leaves a usable drafter; run again with the same arguments it resumes: the collected answers
come from the cache (`verl_tlt.warmup.collect`) and training continues from the checkpoint up to `num_steps`.

`verl-tlt drafter warmup` wraps `warmup_drafter`; the result is exported in the EAGLE layout (see
`verl_tlt.drafter.export`) and can be loaded by the torch engine or by vLLM.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from verl_tlt.config import DrafterConfig
from verl_tlt.drafter.data import DrafterDataBuffer, DrafterSample
from verl_tlt.drafter.family import feature_layers_for
from verl_tlt.drafter.trainer import DrafterTrainer
from verl_tlt.engine import RolloutEngine
from verl_tlt.files import build_once
from verl_tlt.progress import Progress
from verl_tlt.warmup.collect import cached_samples, collect_samples
from verl_tlt.warmup.loss_gap import teacher_loss_gap

__all__ = [
    "WarmupReport",
    "collect_samples",
    "drafter_built_once",
    "prompts_from_parquet",
    "state_dir_of",
    "warmup_drafter",
]

logger = logging.getLogger(__name__)

# How often training is checkpointed (and the drafter exported): a kill loses at most this much work.
CHECKPOINT_EVERY_S = 180.0
# Training stops this long before the budget's end, for the last checkpoint and export (a few seconds on SmolLM2).
FINAL_SAVE_S = 15.0


@dataclass
class WarmupReport:
    num_prompts: int
    num_samples: int
    num_tokens: int
    generate_seconds: float
    train_steps: int
    train_seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    output_dir: str = ""
    resumed_from_step: int = 0  # optimizer steps a previous run had taken (0: a fresh start)
    collected_from_cache: bool = False
    trained_tokens_per_s: float = 0.0
    stopped_by: str = "max_steps"  # max_steps | budget
    # The token loss of the initial drafter on the first batch, dense and from the sparse labels (teacher_top_k).
    teacher_loss_gap: dict[str, float] = field(default_factory=dict)


def state_dir_of(out_dir: str | Path) -> Path:
    """Where a warm-up writing to `out_dir` keeps its training checkpoint."""
    out = Path(out_dir)
    return out.with_name(out.name + ".warmup-state")


def drafter_built_once(
    entry: Path, target: Path, prompts: Callable[[], list[list[int]]], what: str, **settings: Any
) -> Path:
    """The cached drafter export at `entry`, first warmed up (`warmup_drafter(target, prompts(), ..., **settings)`)
    if it is missing.

    The training checkpoint sits at a fixed place beside the entry, not beside the temporary build folder, so a
    build that was killed resumes from it; it is removed once the export is in place.
    """
    state = state_dir_of(entry)

    def warm_up(out_dir: Path) -> None:
        warmup_drafter(str(target), prompts(), out_dir, state_dir=state, **settings)

    path = build_once(entry, lambda folder: (folder / "config.json").is_file(), warm_up, what)
    shutil.rmtree(state, ignore_errors=True)
    return path


def warmup_drafter(
    target_path: str,
    prompts: list[list[int]],
    out_dir: str | Path,
    *,
    num_steps: int = 1000,
    max_seconds: float | None = None,
    budget_seconds: float | None = None,
    temperature: float | Sequence[float] = 1.0,
    max_tokens: int = 512,
    seed: int = 0,
    init_from: str | None = None,
    config: DrafterConfig | None = None,
    resume: bool = True,
    state_dir: str | Path | None = None,
    cache_root: str | Path | None = None,
    checkpoint_every_s: float = CHECKPOINT_EVERY_S,
    device: str = "cpu",
) -> WarmupReport:
    """Train a drafter for the target at target_path on its own answers to `prompts`; export it to out_dir.

    temperature: one sampling temperature, or several (every prompt is answered once per temperature, e.g.
    (0.0, 1.0) to serve both greedy and sampled rollouts well). config: the training recipe (`tlt.drafter`'s
    lr, max_tokens_per_batch, train_depth, loss weights, teacher_top_k, draft_vocab_size, ...; default: its
    defaults); the buffer holds every collected token. num_steps: optimizer steps in all (a resumed run counts the
    earlier ones). max_seconds: of training in this run; budget_seconds: of this whole run, collection included
    (training stops at whichever comes first). resume: continue from `state_dir` (default `<out_dir>.warmup-state`)
    if it holds a checkpoint of the same drafter. seed: of generation and of training. device: cpu (fp32 throughout)
    or cuda: the target answers in bf16 there, and the drafter trains there with fp32 masters under bf16 autocast
    against the target's embedding and head alone (loaded in fp32 after the engine is freed), as spot training does.
    """
    if not prompts:
        raise ValueError("warmup_drafter needs at least one prompt")
    begin = time.monotonic()
    deadline = begin + max(0.0, budget_seconds - FINAL_SAVE_S) if budget_seconds else None
    config = config or DrafterConfig()
    temperatures = [temperature] if isinstance(temperature, (int, float)) else list(temperature)
    on_gpu = torch.device(device).type == "cuda"
    engine = RolloutEngine.from_pretrained(
        target_path, max_num_seqs=64, seed=seed, device=device, dtype=torch.bfloat16 if on_gpu else torch.float32
    )
    # The drafter shares the target's embedding and LM head and never trains them: without this, every step would
    # compute (and keep) vocab x hidden gradients for both.
    engine.model.requires_grad_(False)
    # An EAGLE-3 drafter reads more of the target than its final state: collect those layers with it.
    layers = feature_layers_for(config.family, init_from or "target", engine.model.source_num_layers)
    engine.model.feature_layers = layers
    samples, from_cache = cached_samples(
        engine,
        target_path,
        prompts,
        temperatures,
        max_tokens,
        seed=seed,
        teacher_top_k=config.teacher_top_k,
        cache_root=cache_root,
    )
    generate_seconds = time.monotonic() - begin
    engine.release_cache()  # the KV cache is not needed for training: its memory goes back before the steps
    num_tokens = sum(s.num_tokens for s in samples)
    logger.info("%d samples (%d tokens) ready in %.1f s", len(samples), num_tokens, generate_seconds)

    target = engine.model
    if on_gpu:  # the whole bf16 target served the answers; training needs the shared parts only, in fp32
        from verl_tlt.modeling.weights import load_drafter_parts

        del engine, target
        torch.cuda.empty_cache()
        target = load_drafter_parts(target_path, device=device).requires_grad_(False)
    trainer = _trainer(target, samples, init_from, config, seed)
    state = Path(state_dir) if state_dir is not None else state_dir_of(out_dir)
    resumed = _resume(trainer, state) if resume else 0
    gap = teacher_loss_gap(trainer, samples) if config.teacher_top_k else {}
    metadata = {"warmup_prompts": len(prompts), "warmup_temperatures": temperatures}
    run = _TrainingRun(trainer, state, Path(out_dir), metadata, checkpoint_every_s)
    stopped_by = run.train(num_steps, max_seconds, deadline, resumed)
    report = run.report
    return WarmupReport(
        num_prompts=len(prompts),
        num_samples=len(samples),
        num_tokens=num_tokens,
        generate_seconds=generate_seconds,
        train_steps=trainer.global_step,
        train_seconds=report["seconds"],
        metrics=report["metrics"],
        output_dir=str(out_dir),
        resumed_from_step=resumed,
        collected_from_cache=from_cache,
        trained_tokens_per_s=report["tokens"] / report["seconds"] if report["seconds"] else 0.0,
        stopped_by=stopped_by,
        teacher_loss_gap=gap,
    )


def _trainer(target, samples: list[DrafterSample], init_from: str | None, config: DrafterConfig, seed: int):
    from verl_tlt.drafter.family import drafter_from_init

    init = init_from or "target"
    model = drafter_from_init(init, target, config.family, draft_vocab_size=config.draft_vocab_size)
    num_tokens = sum(s.num_tokens for s in samples)
    trainer = DrafterTrainer(model, DrafterDataBuffer(max_tokens=max(num_tokens, 2)), config, seed=seed)
    trainer.add_samples(samples)
    trainer.apply_draft_vocab()  # the export carries the map even if no step runs
    return trainer


def _resume(trainer: DrafterTrainer, state: Path) -> int:
    """Continue from the checkpoint at `state` if there is one that fits; the steps it had taken (0 if none)."""
    try:
        trainer.load_checkpoint(state)
    except FileNotFoundError:
        return 0
    except ValueError as error:
        logger.warning("Not resuming from %s (%s); training starts afresh", state, error)
        return 0
    logger.info("Resuming the warm-up from %s at optimizer step %d", state, trainer.global_step)
    return trainer.global_step


class _TrainingRun:
    """Training in stretches of at most `checkpoint_every_s`, each followed by a checkpoint and an export."""

    def __init__(self, trainer, state: Path, out: Path, metadata: dict, checkpoint_every_s: float):
        self.trainer, self.state, self.out = trainer, state, out
        self.metadata, self.checkpoint_every_s = metadata, checkpoint_every_s
        self.report = {"seconds": 0.0, "tokens": 0, "metrics": {}}
        self._saved_at: int | None = None  # the optimizer step of the last checkpoint and export

    def train(self, num_steps: int, max_seconds: float | None, deadline: float | None, resumed: int) -> str:
        start = time.monotonic()
        if max_seconds:
            deadline = min(deadline or float("inf"), start + max_seconds)
        progress = Progress("drafter warm-up training", max(0, num_steps - resumed), unit="optimizer steps")
        stopped_by = "max_steps"
        while self.trainer.global_step < num_steps:
            if deadline is not None and time.monotonic() >= deadline:
                stopped_by = "budget"
                break
            stretch_end = time.monotonic() + self.checkpoint_every_s
            until = min(stretch_end, deadline) if deadline is not None else stretch_end
            left = num_steps - self.trainer.global_step
            stretch = _Offset(progress, self.trainer.global_step - resumed)
            taken = self.trainer.train(max_steps=left, deadline=until, progress=stretch)
            self.report["seconds"] += taken.seconds
            self.report["tokens"] += taken.tokens
            self.report["metrics"] = taken.last_metrics or self.report["metrics"]
            if taken.stopped_by == "no_data":
                break
            self._checkpoint()
        if self._saved_at != self.trainer.global_step:
            self._checkpoint()
        logger.info(
            "Warm-up training stopped (%s) at optimizer step %d after %.1f s in this run: %s",
            stopped_by,
            self.trainer.global_step,
            time.monotonic() - start,
            self.report["metrics"],
        )
        return stopped_by

    def _checkpoint(self) -> None:
        from verl_tlt.drafter.family import export_drafter

        self.trainer.save_checkpoint(self.state, include_samples=False, wait=True)
        metadata = {**self.metadata, "warmup_steps": self.trainer.global_step}
        export_drafter(self.trainer.model, self.out, metadata=metadata)
        self._saved_at = self.trainer.global_step


class _Offset:
    """The run's progress, told the optimizer steps of earlier stretches plus this stretch's."""

    def __init__(self, progress: Progress, offset: int):
        self.progress, self.offset = progress, offset

    def update(self, steps: int, extra) -> bool:
        return self.progress.update(self.offset + steps, extra)


def prompts_from_parquet(path: str, tokenizer_path: str, prompt_key: str = "prompt", limit: int | None = None):
    """Token-id prompts from a verl RL parquet (chat messages rendered with the target's chat template)."""
    import pandas as pd
    from transformers import AutoTokenizer

    from verl_tlt.chat import chat_prompt_ids

    frame = pd.read_parquet(path)
    if prompt_key not in frame.columns:
        raise ValueError(f"{path} has no column {prompt_key!r} (columns: {list(frame.columns)}); pass --prompt-key")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    prompts = []
    for messages in frame[prompt_key].tolist()[:limit]:
        if isinstance(messages, str):
            prompts.append(list(tokenizer(messages)["input_ids"]))
            continue
        prompts.append(chat_prompt_ids(tokenizer, messages))
    return prompts
