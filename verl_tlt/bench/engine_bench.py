"""`verl-tlt bench engine`: the torch engine's decode throughput vs transformers' `generate`, same model.

Both decode greedily the same prompts for the same number of new tokens (EOS ignored), in the same process,
one after the other, so the printed ratios come from one run on one (noisy) machine. The engine is measured
eagerly and, unless `compile=False`, also with `RolloutEngine(compile=True)`; the compiled engine's first call
(which compiles) is timed separately as `compile_warmup_s` and is not part of its throughput.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from verl_tlt.files import write_json
from verl_tlt.progress import Progress

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchModel:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    # Small models share the embedding with the LM head; Qwen2.5-7B and larger have their own LM head.
    tie_word_embeddings: bool = True


MODELS = {
    # The toy world's model (verl_tlt.toy.model defaults).
    "toy-1m": BenchModel("toy-1m", 128, 4, 4, 2, 512, 32),
    # A ~50M-parameter Qwen2 (random weights): big enough that matmuls, not Python, dominate a step.
    "qwen2-50m": BenchModel("qwen2-50m", 512, 10, 8, 4, 1536, 32000),
}


def qwen2_config(spec: BenchModel):
    """The transformers Qwen2Config of a bench model (random weights: only the shape matters)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        tie_word_embeddings=spec.tie_word_embeddings,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def build_model(spec: BenchModel, path: Path):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config(spec)).eval()
    model.save_pretrained(path)
    return model


def known_models() -> list[str]:
    """What `--models` takes: the random-weight shapes and the real models `verl-tlt models prepare` makes."""
    from verl_tlt.models.registry import REAL_MODELS

    return sorted([*MODELS, *REAL_MODELS])


def model_folder(name: str, workdir: Path) -> Path:
    """A random-weight shape written under `workdir`, or a real model's prepared folder (prepared if needed)."""
    if name in MODELS:
        path = workdir / name
        build_model(MODELS[name], path)
        return path
    from verl_tlt.models.prepare import ensure_model

    return ensure_model(name)


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A call that waits for `device`'s queued work: CUDA runs kernels asynchronously, so a clock read right after a
    launch would time the launch, not the work. A no-op on the CPU."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def time_call(fn, repeats: int, progress: Progress | None = None) -> float:
    """Best of `repeats` timed calls after one warm-up; `progress` may report between calls, never inside one."""
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if progress is not None:
            progress.heartbeat()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_one(
    name: str,
    batch_size: int,
    prompt_len: int,
    new_tokens: int,
    repeats: int,
    workdir: Path,
    device: str = "cpu",
    compile: bool = True,
    progress: Progress | None = None,
    dtype: str = "float32",
):
    from transformers import AutoModelForCausalLM

    from verl_tlt.engine import RolloutEngine, SamplingParams
    from verl_tlt.engine.config import EngineConfig

    path = model_folder(name, workdir)
    torch_dtype = getattr(torch, dtype)
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device=device).eval()
    # The cache holds these prompts and answers only, not a real model's whole context (8k positions for SmolLM2).
    max_model_len = prompt_len + new_tokens
    config = EngineConfig(max_num_seqs=batch_size, max_model_len=max_model_len)
    engine = RolloutEngine.from_pretrained(str(path), config=config, device=device, dtype=torch_dtype)
    generator = torch.Generator().manual_seed(1)
    # Random ids (above the usual special tokens): decode speed does not depend on what the prompt says.
    prompts = torch.randint(3, hf_model.config.vocab_size, (batch_size, prompt_len), generator=generator)
    hf_prompts = prompts.to(device)  # copied once, outside the timed calls
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)

    def run_engine(engine=engine):
        outputs = engine.generate(prompts.tolist(), params)
        assert all(len(o.token_ids) == new_tokens for o in outputs)
        return outputs

    def run_hf():
        with torch.inference_mode():
            out = hf_model.generate(
                hf_prompts,
                attention_mask=torch.ones_like(hf_prompts),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        assert out.shape[1] == prompt_len + new_tokens  # reading the shape does not wait for the device:
        if out.is_cuda:
            torch.cuda.synchronize()

    engine_s, hf_s = time_call(run_engine, repeats, progress), time_call(run_hf, repeats, progress)
    tokens = batch_size * new_tokens
    compiled = {}
    if compile:
        compiled_config = replace(config, compile=True)
        compiled_engine = RolloutEngine.from_pretrained(
            str(path), config=compiled_config, device=device, dtype=torch_dtype
        )
        start = time.perf_counter()
        compiled_outputs = run_engine(compiled_engine)  # the first call compiles
        warmup_s = time.perf_counter() - start
        same = [o.token_ids for o in compiled_outputs] == [o.token_ids for o in run_engine()]
        compiled_s = time_call(lambda: run_engine(compiled_engine), repeats, progress)
        compiled = {
            "compiled_tokens_per_s": round(tokens / compiled_s, 1),
            "compiled_speedup_vs_hf": round(hf_s / compiled_s, 3),
            "compile_warmup_s": round(warmup_s, 1),
            "compiled_same_tokens": same,
        }
    plan = engine.runner.kernel_plan
    return {
        "model": name,
        "dtype": dtype,
        "params_m": round(sum(p.numel() for p in hf_model.parameters()) / 1e6, 2),
        "weight_bytes": sum(p.numel() * p.element_size() for p in hf_model.parameters()),
        "kernels": plan.summary() if plan is not None else None,
        "batch_size": batch_size,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "tokens_per_s": round(tokens / engine_s, 1),
        "hf_tokens_per_s": round(tokens / hf_s, 1),
        "speedup_vs_hf": round(hf_s / engine_s, 3),
        **compiled,
    }


def run(
    json_path: str | None,
    models: list[str],
    batch_sizes: list[int],
    prompt_len: int,
    new_tokens: int,
    repeats: int,
    device: str = "cpu",
    compile: bool = True,
    dtypes: tuple[str, ...] | list[str] = ("float32",),
) -> dict:
    from verl_tlt.bench.host import host_info, memory_bandwidth

    bandwidth = memory_bandwidth() if device == "cpu" else None
    if bandwidth:
        print(f"memory bandwidth (matrix-vector product over 256 MB fp32): {bandwidth / 1e9:.1f} GB/s", flush=True)
    rows = []
    cells = len(models) * len(batch_sizes) * len(dtypes)
    progress = Progress("bench engine", cells, unit="model x batch size x dtype cells")
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in dtypes:
            for name in models:
                for batch_size in batch_sizes:
                    row = bench_one(
                        name,
                        batch_size,
                        prompt_len,
                        new_tokens,
                        repeats,
                        Path(tmp),
                        device,
                        compile,
                        progress,
                        dtype,
                    )
                    if bandwidth and batch_size == 1:
                        # Batch-1 decode reads every weight once per token: bandwidth / weight bytes bounds it
                        # (unless the weights fit in the caches).
                        row["roofline_tokens_per_s"] = round(bandwidth / row["weight_bytes"], 1)
                        row["of_roofline"] = round(row["tokens_per_s"] / row["roofline_tokens_per_s"], 3)
                        # How fast generate already is bounds the speedup any engine can show here: roofline / HF.
                        row["hf_of_roofline"] = round(row["hf_tokens_per_s"] / row["roofline_tokens_per_s"], 3)
                    rows.append(row)
                    progress.advance(extra=f"{name} bs={batch_size} {dtype} done")
                    print(_row_line(row, compile), flush=True)
    result = {
        "benchmark": "engine",
        "host": host_info(),
        "memory_bandwidth_bytes_per_s": bandwidth,
        "torch_threads": torch.get_num_threads(),
        "dtypes": list(dtypes),
        "device": device,
        "decoding": "greedy, EOS ignored, best of repeats after one warm-up",
        "compiled": compile,
        "rows": rows,
    }
    if json_path:
        write_json(json_path, result)
    return result


def _row_line(row: dict, compile: bool) -> str:
    line = (
        f"{row['model']:>10} {row['dtype']:>8} bs={row['batch_size']:>3}: engine {row['tokens_per_s']:>8.1f} tok/s, "
        f"HF generate {row['hf_tokens_per_s']:>8.1f} tok/s, speedup {row['speedup_vs_hf']:.2f}x"
    )
    if "roofline_tokens_per_s" in row:
        line += (
            f"; roofline {row['roofline_tokens_per_s']:.1f} tok/s (engine {100 * row['of_roofline']:.0f}%, "
            f"generate {100 * row['hf_of_roofline']:.0f}%)"
        )
    if compile:
        line += (
            f"; compiled {row['compiled_tokens_per_s']:>8.1f} tok/s, speedup "
            f"{row['compiled_speedup_vs_hf']:.2f}x (compiling took {row['compile_warmup_s']:.0f} s)"
        )
    return line
