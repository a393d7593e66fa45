"""`verl-tlt bench drafter-train`: what one drafter optimizer step costs, the dense recipe against the new one.

Recipes, on the same target, packed batch and drafter start, measured one after the other (one untimed step, then
`rounds` timed ones; only one recipe's drafter and optimizer exist at a time, so the 7B shape fits a 24 GB host):
- dense: the teacher recomputed by the target's full LM head at every step, the drafter's head over the whole
  vocabulary, the loss over all pairs at once (`tlt.drafter.teacher_top_k=0 draft_vocab_size=0`, the old recipe);
- sparse: sparse teacher labels computed once (`teacher_top_k`), the head over the whole vocabulary, chunked loss;
- sparse+draft_vocab: the default recipe, with the drafter's head over `draft_vocab_size` tokens as well.
Shapes (random weights: only sizes matter for cost): the toy target, SmolLM2-135M and Qwen2.5-7B (152k head, its
own LM head); one decoder layer is built, since the drafter uses only the target's embedding and head. The data are
random token ids and unit-scale hidden states in samples of SAMPLE_TOKENS tokens, packed (attention runs per sample,
so its cost depends on the samples' length; one sample of the batch's whole length would make it quadratic in the
batch); the draft vocabulary is the first `draft_vocab_size` ids.

Printed per shape and recipe: trained pairs per second, seconds per step, the step's peak memory above what was held
before it (CUDA: the allocator's peak; CPU: the process's resident set, sampled every millisecond), and the speedup
over dense. Labelling cost (once per captured token, outside the steps) is printed per 1k tokens.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path

import torch

from verl_tlt.bench.engine_bench import MODELS, BenchModel, synchronizer
from verl_tlt.bench.host import device_info, host_info
from verl_tlt.config import DrafterConfig
from verl_tlt.files import write_json
from verl_tlt.progress import Progress

logger = logging.getLogger(__name__)

SHAPES = {
    "toy": dataclasses.replace(MODELS["toy-1m"], name="toy", num_layers=1),
    "smollm2-135m": BenchModel("smollm2-135m", 576, 1, 9, 3, 1536, 49152),
    "qwen2.5-7b": BenchModel("qwen2.5-7b", 3584, 1, 28, 4, 18944, 152064, tie_word_embeddings=False),
}
DEFAULT_SHAPES = tuple(SHAPES)
# Tokens per step: tlt.drafter.max_tokens_per_batch's default, except the 7B shape on a CPU (about a minute a step).
DEFAULT_TOKENS = 4096
CPU_7B_TOKENS = 256
RECIPES = ("dense", "sparse", "sparse+draft_vocab")
# Tokens per packed sample: a mid-length reasoning answer (SmolLM2's answers to the tasks: p50 34-233, p90 256).
SAMPLE_TOKENS = 512


def recipe_config(recipe: str, tokens: int) -> DrafterConfig:
    defaults = DrafterConfig()
    keys = {
        "dense": {"teacher_top_k": 0, "draft_vocab_size": 0},
        "sparse": {"draft_vocab_size": 0},
        "sparse+draft_vocab": {},
    }[recipe]
    return dataclasses.replace(defaults, max_tokens_per_batch=tokens, **keys)


class PeakMemory:
    """Peak memory above the level at `start()`: CUDA's allocator peak, or the resident set sampled every ~1 ms."""

    def __init__(self, device: torch.device):
        self.device = device
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.base = self.peak = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        self.base = self.peak = _resident_bytes()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def stop(self) -> int:
        """Bytes above the start level at the peak."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self.base
        self._stop.set()
        self._thread.join()
        return max(0, self.peak - self.base)

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _resident_bytes())


def _resident_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096


def random_samples(shape: BenchModel, tokens: int, seed: int, *, pairs: bool) -> list:
    """Random token ids and unit-scale hidden states, every position a response, in samples of SAMPLE_TOKENS (the
    last shorter): `tokens` training pairs in all (pairs=True: each sample one token longer, as T tokens hold T - 1
    pairs) or `tokens` tokens (pairs=False: whole samples fill a batch of `tokens` tokens exactly)."""
    from verl_tlt.drafter.data import DrafterSample

    generator = torch.Generator().manual_seed(seed)
    samples = []
    for start in range(0, tokens, SAMPLE_TOKENS):
        length = min(SAMPLE_TOKENS, tokens - start) + int(pairs)
        samples.append(
            DrafterSample(
                torch.randint(shape.vocab_size, (length,), generator=generator),
                torch.randn(length, shape.hidden_size, generator=generator),
                torch.ones(length, dtype=torch.bool),
            )
        )
    return samples


def _batch_and_labels(shape: BenchModel, target, tokens: int, top_k: int, device: torch.device, seed: int):
    """One packed batch of `tokens` random pairs (labelled with the target's top-k when top_k > 0), and the seconds
    the labelling took."""
    from verl_tlt.drafter.data import pack
    from verl_tlt.drafter.teacher import teacher_labels

    samples = random_samples(shape, tokens, seed, pairs=True)
    if not top_k:
        return pack(samples), 0.0
    sync = synchronizer(device)
    begin = time.perf_counter()
    head = target.lm_head.weight
    samples = [sample.labelled(teacher_labels(sample.hidden_states, head, top_k)) for sample in samples]
    sync()
    return pack(samples), time.perf_counter() - begin


def _trainer(target, shape: BenchModel, config: DrafterConfig, seed: int):
    from verl_tlt.drafter.data import DrafterDataBuffer
    from verl_tlt.drafter.draft_vocab import DraftVocab
    from verl_tlt.drafter.model import EagleDrafterModel
    from verl_tlt.drafter.trainer import DrafterTrainer

    torch.manual_seed(seed)
    model = EagleDrafterModel.from_target(target)
    if config.draft_vocab_size:
        ids = torch.arange(min(config.draft_vocab_size, shape.vocab_size))
        model.set_draft_vocab(DraftVocab(ids, shape.vocab_size, config.draft_vocab_size))
    return DrafterTrainer(model, DrafterDataBuffer(max_tokens=2), config, seed=seed)


def measure_shape(shape: BenchModel, tokens: int, rounds: int, device: torch.device, progress: Progress) -> list[dict]:
    """One row per recipe: the mean of `rounds` timed steps after one untimed step."""
    from verl_tlt.bench.random_target import build_target, model_spec

    sync = synchronizer(device)
    target = build_target(model_spec(shape), device, torch.float32, seed=0).requires_grad_(False)
    memory = PeakMemory(device)
    rows = []
    for recipe in RECIPES:
        config = recipe_config(recipe, tokens)
        batch, label_seconds = _batch_and_labels(shape, target, tokens, config.teacher_top_k, device, seed=0)
        trainer = _trainer(target, shape, config, seed=0)
        trainer.train_step(batch)  # warm-up: kernels, allocator, lazy copies
        seconds, peak = 0.0, 0
        for _ in range(rounds):
            sync()
            memory.start()
            begin = time.perf_counter()
            trainer.train_step(batch)
            sync()
            seconds += time.perf_counter() - begin
            peak = max(peak, memory.stop())
            progress.advance(extra=f"{shape.name} {recipe}")
        step = seconds / rounds
        rows.append(
            {
                "shape": shape.name,
                "recipe": recipe,
                "tokens_per_step": batch.num_pairs,
                "step_s": step,
                "tokens_per_s": batch.num_pairs / step,
                "peak_mb": peak / 2**20,
                "label_s_per_1k_tokens": 1000 * label_seconds / batch.num_pairs,
                "autocast": str(trainer.autocast).removeprefix("torch.") if trainer.autocast else "fp32",
            }
        )
        del trainer, batch
    dense = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup_vs_dense"] = row["tokens_per_s"] / dense
    return rows


def run(
    json_path: str | None,
    shapes: list[str],
    tokens: int | None,
    rounds: int,
    *,
    device: str = "cpu",
) -> dict:
    torch_device = torch.device(device)
    plan = [(SHAPES[name], tokens or _default_tokens(name, torch_device)) for name in shapes]
    progress = Progress("bench drafter-train", len(plan) * rounds * len(RECIPES), unit="timed steps")
    rows = []
    for shape, shape_tokens in plan:
        rows += measure_shape(shape, shape_tokens, rounds, torch_device, progress)
        for row in rows[-len(RECIPES) :]:
            print(_row_line(row), flush=True)
    defaults = DrafterConfig()
    result = {
        "benchmark": "drafter-train",
        **host_info(),
        **device_info(torch_device),
        "rounds": rounds,
        "teacher_top_k": defaults.teacher_top_k,
        "draft_vocab_size": defaults.draft_vocab_size,
        "rows": rows,
    }
    if json_path:
        write_json(json_path, result)
    return result


def _default_tokens(shape: str, device: torch.device) -> int:
    return CPU_7B_TOKENS if shape == "qwen2.5-7b" and device.type == "cpu" else DEFAULT_TOKENS


def _row_line(row: dict) -> str:
    return (
        f"{row['shape']:>13} {row['recipe']:>18}: {row['tokens_per_s']:9.0f} tokens/s, {row['step_s']:7.3f} s/step "
        f"({row['tokens_per_step']} tokens), peak +{row['peak_mb']:7.0f} MB, {row['speedup_vs_dense']:5.2f}x dense, "
        f"labels {row['label_s_per_1k_tokens']:.3f} s/1k tokens, {row['autocast']}"
    )
