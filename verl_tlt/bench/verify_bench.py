"""`verl-tlt bench verify`: what one target forward costs when it verifies k draft tokens, and the SD step overhead.

The target is a random-weight Qwen2 of a named shape (`MODELS`), built directly on the device in each dtype
(`random_target`: no checkpoint, no fp32 copy on the host), one dtype after the other.

Verify cost. For each dtype the engine prefills `context_len` random tokens into max(batch_sizes) cache slots
(one real prefill `step()`). Then, for each batch size (the first `batch_size` slots), mode and k, a draft tree of
k nodes plus the root (width k + 1 tokens a row) is verified exactly as the engine's speculative step
(`engine.speculative_step`) does it: `tree_forward_layout` (outside the timing), then `engine.runner.forward` and
`engine.model.logits` on every node (timed). k = 0 is a plain decode step (the root alone, width 1): the same layout
and mask as `RolloutEngine._decode`, run as a "decode" forward. The forward writes only scratch positions after each
row's prefix, so repeating it leaves the cache valid. Chain trees have parents[i] = i - 1; tree mode fills an EAGLE-2
like tree breadth first with 4 children per node. Each cell is timed as the best of `repeats` calls after one
warm-up call of the same shape; on CUDA every call ends with a synchronize, so the clock reads the kernels' time,
not their launch. cost_vs_k1 = time(k) / time(k=1) for the same (mode, dtype, batch_size); k = 1 is always
measured first.

SD overhead (`sd_overhead`): in the first of the requested dtypes, at batch 1, unless `sd_steps` is 0.

All numbers come from one run on one (noisy) machine; the JSON records where (device, its name, torch, commit).
"""

from __future__ import annotations

import torch

from verl_tlt.bench.engine_bench import BenchModel, synchronizer, time_call
from verl_tlt.bench.host import device_info, host_info
from verl_tlt.bench.random_target import build_target, model_spec, num_parameters, weight_bytes
from verl_tlt.bench.sd_overhead import SD_STRATEGIES, EmbeddingDrafter, bench_sd_overhead, print_sd
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.config import EngineConfig
from verl_tlt.engine.model_runner import tree_forward_layout
from verl_tlt.files import write_json
from verl_tlt.modeling.model import CausalLM
from verl_tlt.progress import Progress
from verl_tlt.spec.tree import DraftTree

MODELS = {
    # A ~142M-parameter Qwen2 (random weights, GQA, SmolLM-sized vocabulary, tied embeddings).
    "qwen2-150m": BenchModel("qwen2-150m", 768, 12, 12, 4, 3072, 49152),
    # A tiny Qwen2 for smoke tests.
    "qwen2-tiny": BenchModel("qwen2-tiny", 64, 2, 4, 2, 128, 97),
    # Qwen2.5-7B's shape (7.6B parameters, own LM head): 15 GB in bf16, a GPU-only measurement.
    "qwen2.5-7b": BenchModel("qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, tie_word_embeddings=False),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MODES = ("chain", "tree")
TREE_BRANCHING = 4
# Weights above this refuse to run on the CPU without an explicit override: a 7B forward there takes minutes.
CPU_MAX_WEIGHT_BYTES = 8 << 30


def device_problem(device: str, model: str, dtypes: list[str], allow_large_cpu: bool) -> str | None:
    """Why the bench cannot run `model` in `dtypes` on `device` (what is wrong and the fix), or None if it can."""
    if device == "cuda" and not torch.cuda.is_available():
        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (
            f"--device cuda, but torch {torch.__version__} sees no CUDA device ({build}); run it on a GPU machine "
            "with a CUDA build of torch, or use --device cpu"
        )
    if device == "cpu" and not allow_large_cpu:
        return cpu_size_problem(model, dtypes)
    return None


def cpu_size_problem(model: str, dtypes: list[str]) -> str | None:
    """Why `model` in `dtypes` is too big for a CPU bench (what is wrong and the fix), or None if it is not."""
    spec = model_spec(MODELS[model])
    sizes = {name: weight_bytes(spec, DTYPES[name]) for name in dtypes}
    too_big = {name: size for name, size in sizes.items() if size > CPU_MAX_WEIGHT_BYTES}
    if not too_big:
        return None
    listed = ", ".join(f"{size / 1e9:.1f} GB in {name}" for name, size in too_big.items())
    return (
        f"--model {model} has {num_parameters(spec) / 1e9:.2f}B parameters ({listed}): too big for a CPU bench "
        f"(over {CPU_MAX_WEIGHT_BYTES >> 30} GiB of weights; a forward of the larger cells takes minutes there). "
        "Run it with --device cuda, or pass --allow-large-cpu to run it on the CPU anyway"
    )


# ----- draft-tree shapes -----------------------------------------------------------------------------------


def tree_parents(mode: str, k: int) -> list[int]:
    """Parent of each of the k + 1 nodes (root first): a chain, or a breadth-first tree with 4 children a node."""
    if mode == "chain":
        return [0] + list(range(k))
    if mode == "tree":
        return [0] + [(i - 1) // TREE_BRANCHING for i in range(1, k + 1)]
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def make_tree(
    mode: str, batch_size: int, k: int, vocab_size: int, generator: torch.Generator, device: torch.device | str = "cpu"
) -> DraftTree:
    """A batch of identical-shape draft trees with k draft nodes plus the root and random tokens, on `device`."""
    parents = tree_parents(mode, k)
    depths = [0] * (k + 1)
    for node in range(1, k + 1):
        depths[node] = depths[parents[node]] + 1
    tokens = torch.randint(3, vocab_size, (batch_size, k + 1), generator=generator)  # drawn on the CPU: seeded alike
    return DraftTree(
        tokens=tokens.to(device),
        parents=torch.tensor(parents, device=device).expand(batch_size, k + 1).clone(),
        depths=torch.tensor(depths, device=device).expand(batch_size, k + 1).clone(),
    )


# ----- engine setup ----------------------------------------------------------------------------------------


def make_engine(model: CausalLM, max_num_seqs: int) -> RolloutEngine:
    # No EOS ids: every bench request ignores EOS.
    return RolloutEngine(model, EngineConfig(max_num_seqs=max_num_seqs), eos_token_ids=())


def prefill(engine: RolloutEngine, batch_size: int, context_len: int, generator: torch.Generator) -> None:
    """Admit `batch_size` random prompts of `context_len` tokens and run the engine's prefill step on them."""
    vocab_size = engine.model.spec.vocab_size
    prompts = torch.randint(3, vocab_size, (batch_size, context_len), generator=generator).tolist()
    params = SamplingParams(temperature=0, max_tokens=engine.max_model_len, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params)
    engine.step()
    if engine.scheduler.cache_lens != [context_len] * batch_size:
        raise RuntimeError(f"prefill left cache lengths {engine.scheduler.cache_lens}, expected {context_len} per row")


# ----- verify cost -----------------------------------------------------------------------------------------


def time_verify(
    engine: RolloutEngine, tree: DraftTree, cache_len: int, repeats: int, progress: Progress | None = None
) -> float:
    """Best-of-`repeats` seconds for one target forward (+ logits at every node) verifying `tree` (on the device)."""
    batch_size = tree.tokens.shape[0]
    lens = torch.full((batch_size,), cache_len, dtype=torch.long, device=engine.device)
    engine.cache.ensure_capacity(engine.cache.num_slots, cache_len + tree.num_nodes)
    positions, write_pos, mask = tree_forward_layout(tree, lens)
    kind = "decode" if tree.num_nodes == 1 else "verify"  # the root alone is a plain decode step
    sync = synchronizer(engine.device)

    def verify() -> None:
        hidden = engine.runner.forward(kind, tree.tokens, positions, 0, write_pos, mask)
        engine.model.logits(hidden)
        sync()  # every call ends with the device idle, so the next clock read starts on an empty queue

    with torch.inference_mode():
        return time_call(verify, repeats, progress)


def bench_dtype(
    engine: RolloutEngine,
    dtype_name: str,
    modes: list[str],
    batch_sizes: list[int],
    ks: list[int],
    context_len: int,
    repeats: int,
    progress: Progress | None = None,
) -> list[dict]:
    """Rows for one dtype: every (batch_size, mode, k), cost relative to k=1 (always measured first)."""
    generator = torch.Generator().manual_seed(2)
    prefill(engine, max(batch_sizes), context_len, generator)
    vocab_size = engine.model.spec.vocab_size
    rows = []
    for batch_size in batch_sizes:
        for mode in modes:
            base = None
            for k in [1] + sorted(set(ks) - {1}):
                tree = make_tree(mode, batch_size, k, vocab_size, generator, engine.device)
                seconds = time_verify(engine, tree, context_len, repeats, progress)
                if progress is not None:
                    progress.advance(extra=f"{dtype_name} {mode} bs={batch_size} k={k}")
                base = seconds if k == 1 else base
                if k not in ks:
                    continue
                row = {
                    "mode": mode,
                    "dtype": dtype_name,
                    "batch_size": batch_size,
                    "k": k,
                    "cost_vs_k1": round(seconds / base, 4),
                    "forward_ms": round(seconds * 1e3, 3),
                }
                rows.append(row)
                print(
                    f"verify {dtype_name:>8} {mode:>5} bs={batch_size:>3} k={k:>3}: {row['forward_ms']:>10.2f} ms, "
                    f"{row['cost_vs_k1']:>7.3f}x k=1",
                    flush=True,
                )
    engine.reset()
    engine.release_cache()  # before the next engine (SD overhead, or the next dtype) allocates its own
    return rows


def sd_overhead(model: CausalLM, context_len: int, steps: int, warmup: int, progress: Progress) -> list[dict]:
    """One `sd_overhead` entry per strategy, each on a fresh batch-1 engine over `model`."""
    entries = []
    for strategy in SD_STRATEGIES:
        engine = make_engine(model, 1)
        engine.set_drafter(EmbeddingDrafter(model))  # before the prefill, which records the hidden states it asks for
        prefill(engine, 1, context_len, torch.Generator().manual_seed(3))
        entries.append(bench_sd_overhead(engine, strategy, steps, warmup))
        engine.reset()
        engine.release_cache()
        progress.advance(extra=f"SD step overhead {strategy}")
        print_sd(entries[-1])
    return entries


# ----- entry point -----------------------------------------------------------------------------------------


def run(
    json_path: str | None,
    model: str,
    batch_sizes: list[int],
    ks: list[int],
    dtypes: list[str],
    modes: list[str],
    context_len: int,
    repeats: int,
    sd_steps: int = 20,
    sd_warmup: int = 3,
    device: str = "cpu",
) -> dict:
    """Run both measurements (SD overhead only if sd_steps > 0), print a line per row, return (and optionally write)
    the JSON result."""
    torch_device = torch.device(device)
    spec = model_spec(MODELS[model])
    size_m = round(num_parameters(spec) / 1e6, 1)
    where = device_info(torch_device)
    on = f"{device} ({where['device_name']}), {torch.get_num_threads()} torch threads"
    print(f"model {model}: {size_m}M parameters, {on}", flush=True)
    cells = len(dtypes) * len(batch_sizes) * len(modes) * len(set(ks) | {1}) + (len(SD_STRATEGIES) if sd_steps else 0)
    progress = Progress("bench verify", cells, unit="measurements")
    rows, sd = [], []
    for index, dtype_name in enumerate(dtypes):
        target = build_target(spec, torch_device, DTYPES[dtype_name])
        engine = make_engine(target, max(batch_sizes))
        rows += bench_dtype(engine, dtype_name, modes, batch_sizes, ks, context_len, repeats, progress)
        del engine
        if index == 0 and sd_steps:
            sd = sd_overhead(target, context_len, sd_steps, sd_warmup, progress)
        del target
        if torch_device.type == "cuda":
            torch.cuda.empty_cache()  # hand the dtype's weights back before the next dtype's are allocated
    result = {
        "benchmark": "verify",
        "model": model,
        "params_m": size_m,
        "context_len": context_len,
        **where,
        **host_info(),
        "batch_sizes": batch_sizes,
        "ks": ks,
        "repeats": repeats,
        "timing": "verify: best of repeats after one warm-up, each call synchronized with the device; target forward "
        "+ logits at every node, layout excluded; width = k + 1 tokens a row, k = 0 a plain decode step; tree mode: "
        f"breadth-first, {TREE_BRANCHING} children per node",
        "rows": rows,
        **sd_summary(sd),
    }
    if json_path:
        write_json(json_path, result)
    return result


def sd_summary(sd: list[dict]) -> dict:
    """The JSON's SD-overhead fields; with no entries (sd_steps 0) the fraction is None."""
    summary = {
        "sd_drafter": "target embedding -> final norm -> LM head (no layers), hidden-state bookkeeping on",
        "sd_overhead": sd,
        "sd_overhead_fraction_bs1": None,
        "sd_overhead_fraction_bs1_source": "not measured (sd_steps 0)",
        "sd_overhead_fraction_target": 0.10,
    }
    if sd:
        worst = max(sd, key=lambda entry: entry["overhead_fraction"])
        summary["sd_overhead_fraction_bs1"] = worst["overhead_fraction"]
        summary["sd_overhead_fraction_bs1_source"] = (
            f"max over strategies: {worst['strategy']} ({worst['dtype']}, batch 1)"
        )
    return summary
