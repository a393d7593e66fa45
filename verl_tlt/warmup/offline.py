"""Offline drafter warm-up: the target generates answers to a prompt set, its hidden states are recorded, and an
EAGLE drafter trains on them, so an RL run starts from a drafter that already agrees with its policy.

`verl-tlt drafter warmup` wraps `warmup_drafter`; the result is exported in the EAGLE layout (see
`verl_tlt.drafter.export`) and can be loaded by the torch engine or by vLLM.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from verl_tlt.config import DrafterConfig
from verl_tlt.drafter.data import DrafterDataBuffer, DrafterSample
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.drafter.teacher import teacher_labels
from verl_tlt.drafter.trainer import DrafterTrainer
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.modeling.model import sequence_hidden_states
from verl_tlt.progress import Progress

logger = logging.getLogger(__name__)


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


def collect_samples(
    engine: RolloutEngine, prompts: list[list[int]], params: SamplingParams, step: int = 0, *, teacher_top_k: int = 0
) -> list[DrafterSample]:
    """Generate answers with the target and pair every token with the target's final hidden state (and, with
    teacher_top_k > 0, its sparse next-token distribution, `verl_tlt.drafter.teacher`)."""
    what = f"drafter warm-up, T={params.temperature:g}"
    outputs = engine.generate(prompts, params, progress=Progress(f"{what} answers", len(prompts), unit="answers"))
    recorded = Progress(f"{what} hidden states", len(prompts), unit="answers")
    samples = []
    for prompt, output in zip(prompts, outputs, strict=True):
        ids = prompt + output.token_ids
        hidden = sequence_hidden_states(engine.model, ids)
        response = torch.arange(len(ids)) >= len(prompt)
        teacher = teacher_labels(hidden, engine.model.lm_head.weight, teacher_top_k) if teacher_top_k else None
        samples.append(DrafterSample(torch.tensor(ids), hidden, response, step, teacher))
        recorded.advance()
    return samples


def warmup_drafter(
    target_path: str,
    prompts: list[list[int]],
    out_dir: str | Path,
    *,
    num_steps: int = 1000,
    max_seconds: float | None = None,
    temperature: float | Sequence[float] = 1.0,
    max_tokens: int = 512,
    seed: int = 0,
    init_from: str | None = None,
    config: DrafterConfig | None = None,
) -> WarmupReport:
    """Train a drafter for the target at target_path on its own answers to `prompts`; export it to out_dir.

    temperature: one sampling temperature, or several (every prompt is answered once per temperature, e.g.
    (0.0, 1.0) to serve both greedy and sampled rollouts well). config: the training recipe (`tlt.drafter`'s
    lr, max_tokens_per_batch, train_depth, loss weights, ...; default: its defaults); its buffer and spot-training
    keys do not apply here, the buffer holds every collected token. seed: of generation and of training.
    """
    from verl_tlt.drafter.export import export_eagle
    from verl_tlt.drafter.load import load_eagle

    if not prompts:
        raise ValueError("warmup_drafter needs at least one prompt")
    torch.manual_seed(seed)
    engine = RolloutEngine.from_pretrained(target_path, max_num_seqs=64, seed=seed)
    # The drafter shares the target's embedding and LM head and never trains them: without this, every step would
    # compute (and keep) vocab x hidden gradients for both.
    engine.model.requires_grad_(False)
    temperatures = [temperature] if isinstance(temperature, (int, float)) else list(temperature)
    config = config or DrafterConfig()
    start = time.monotonic()
    samples = []
    for temp in temperatures:
        params = SamplingParams(temperature=temp, max_tokens=max_tokens)
        samples += collect_samples(engine, prompts, params, teacher_top_k=config.teacher_top_k)
    generate_seconds = time.monotonic() - start
    num_tokens = sum(s.num_tokens for s in samples)
    logger.info("Collected %d samples (%d tokens) in %.1f s", len(samples), num_tokens, generate_seconds)

    model = load_eagle(init_from, engine.model) if init_from else EagleDrafterModel.from_target(engine.model)
    trainer = DrafterTrainer(model, DrafterDataBuffer(max_tokens=max(num_tokens, 2)), config, seed=seed)
    trainer.add_samples(samples)
    trainer.apply_draft_vocab()  # the export carries the map even if no step runs
    deadline = time.monotonic() + max_seconds if max_seconds else None
    progress = Progress("drafter warm-up training", num_steps, unit="optimizer steps")
    report = trainer.train(max_steps=num_steps, deadline=deadline, progress=progress)
    logger.info("Trained %d steps in %.1f s: %s", report.steps, report.seconds, report.last_metrics)
    metadata = {"warmup_steps": report.steps, "warmup_prompts": len(prompts), "warmup_temperatures": temperatures}
    path = export_eagle(model, out_dir, metadata=metadata)
    return WarmupReport(
        num_prompts=len(prompts),
        num_samples=len(samples),
        num_tokens=num_tokens,
        generate_seconds=generate_seconds,
        train_steps=report.steps,
        train_seconds=report.seconds,
        metrics=report.last_metrics,
        output_dir=str(path),
    )


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
