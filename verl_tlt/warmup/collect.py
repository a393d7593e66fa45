"""The warm-up's data: the target's own answers to the prompts, each token paired with the target's hidden state and
its sparse next-token distribution, cached so that a warm-up run again (to resume, or with more steps) skips them.

The cache key covers everything the data depend on: the target's files (config, and each weight file's name, size
and modification time), the prompts, the temperatures, the token cap, the seed and the teacher's top-k. Entries are
`safe_state` directories (JSON + safetensors, never a pickle) under the project's cache root.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from verl_tlt.drafter.data import DrafterSample
from verl_tlt.drafter.safe_state import load_state, save_state
from verl_tlt.drafter.teacher import teacher_labels
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.files import default_cache_root
from verl_tlt.modeling.model import sequence_hidden_states
from verl_tlt.progress import Progress

logger = logging.getLogger(__name__)

SAMPLES_KIND = "drafter_warmup_samples"
# Bump when what is collected changes, so stale entries are not reused.
COLLECT_VERSION = 1


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
        hidden = sequence_hidden_states(engine.model, ids)  # [final | feature layers], if the target has any
        final = hidden[:, : engine.model.spec.hidden_size]
        response = torch.arange(len(ids)) >= len(prompt)
        teacher = teacher_labels(final, engine.model.lm_head.weight, teacher_top_k) if teacher_top_k else None
        teacher = teacher.to("cpu") if teacher is not None else None  # samples live in host memory (and the cache)
        samples.append(DrafterSample(torch.tensor(ids), hidden.cpu(), response, step, teacher))
        recorded.advance()
    return samples


def collection_key(
    target_path: str | Path,
    prompts: Sequence[Sequence[int]],
    temperatures: Sequence[float],
    max_tokens: int,
    seed: int,
    teacher_top_k: int,
    precision: str = "float32",
    feature_layers: Sequence[int] = (),
) -> str:
    """A digest of everything the collected samples depend on (precision: the engine's dtype, e.g. bfloat16 on a
    GPU, whose answers and hidden states differ from fp32's)."""
    target = Path(target_path)
    files = sorted(
        (path.name, path.stat().st_size, path.stat().st_mtime_ns)
        for path in target.iterdir()
        if path.suffix in (".safetensors", ".bin", ".json")
    )
    identity = {
        "version": COLLECT_VERSION,
        "target": str(target.resolve()),
        "files": files,
        "prompts": [list(p) for p in prompts],
        "temperatures": [float(t) for t in temperatures],
        "max_tokens": max_tokens,
        "seed": seed,
        "teacher_top_k": teacher_top_k,
    }
    if precision != "float32":  # keyed only where it differs, so fp32 collections cached before stay valid
        identity["precision"] = precision
    if feature_layers:  # EAGLE-3's layers travel with each token; EAGLE-1 collections keep their keys
        identity["feature_layers"] = [int(i) for i in feature_layers]
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def cached_samples(
    engine: RolloutEngine,
    target_path: str | Path,
    prompts: list[list[int]],
    temperatures: Sequence[float],
    max_tokens: int,
    *,
    seed: int = 0,
    teacher_top_k: int = 0,
    cache_root: str | Path | None = None,
) -> tuple[list[DrafterSample], bool]:
    """(samples, whether they came from the cache): every prompt answered once per temperature, collected once."""
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    precision = str(engine.model.lm_head.weight.dtype).removeprefix("torch.")
    layers = engine.model.feature_layers
    key = collection_key(target_path, prompts, temperatures, max_tokens, seed, teacher_top_k, precision, layers)
    entry = root / "warmup-samples" / key
    try:
        state = load_state(entry, kind=SAMPLES_KIND)
        samples = [DrafterSample.from_fields(fields, f"{entry}/samples/{i}") for i, fields in enumerate(state)]
        logger.info("Reusing the %d collected warm-up answers at %s", len(samples), entry)
        return samples, True
    except FileNotFoundError:
        pass
    except ValueError as error:  # damaged: collect again (the entry is replaced below)
        logger.warning("Collecting the warm-up answers again: the cached ones at %s are unreadable (%s)", entry, error)
    torch.manual_seed(seed)
    samples = []
    for temperature in temperatures:
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        samples += collect_samples(engine, prompts, params, teacher_top_k=teacher_top_k)
    save_state(entry, [sample.fields() for sample in samples], kind=SAMPLES_KIND)
    logger.info("Cached %d warm-up answers at %s", len(samples), entry)
    return samples, False
