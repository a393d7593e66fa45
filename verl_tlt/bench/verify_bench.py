"""`verl-tlt bench verify`: what one target forward costs when it verifies k draft tokens, and the SD step overhead.

Verify cost. For each dtype the engine prefills `context_len` random tokens into max(batch_sizes) cache slots
(one real prefill `step()`). Then, for each batch size (the first `batch_size` slots), mode and k, a draft tree of
k nodes plus the root (k + 1 tokens) is verified exactly as `RolloutEngine._decode_speculative` does it:
`tree_forward_layout` (outside the timing), then `engine._forward` and `engine.model.logits` on every node (timed).
The forward writes only scratch positions after each row's prefix, so repeating it leaves the cache valid. Chain
trees have parents[i] = i - 1; tree mode fills an EAGLE-2 like tree breadth first with 4 children per node. Each
cell is timed as the best of `repeats` calls after one warm-up; cost_vs_k1 = time(k) / time(k=1) for the same
(mode, dtype, batch_size).

SD overhead. At batch 1 in fp32, real speculative steps `engine.step(strategy)` run with a cheap stateless drafter
(the target's embedding -> final norm -> LM head, no layers; it still asks for hidden states like an EAGLE head, so
the engine's hidden-state bookkeeping is included). Each step is timed whole, along with the target forward inside
it (`engine._forward` + `engine.model.logits`) and the drafter calls (`begin` + `expand`). Overhead = step - target -
drafter: the tree search, masks, sampling/verification, KV compaction and bookkeeping. The fraction is summed
overhead / summed step time over the measured steps after warm-up.

All numbers come from one run on one (noisy) machine; they are ratios to read, not tests.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from verl_tlt.bench.engine_bench import BenchModel, build_model, time_call
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.drafter import DraftContext, Drafter
from verl_tlt.engine.speculative import tree_forward_layout
from verl_tlt.files import write_json
from verl_tlt.progress import Progress
from verl_tlt.spec.tree import DraftTree

MODELS = {
    # A ~142M-parameter Qwen2 (random weights, GQA, SmolLM-sized vocabulary, tied embeddings).
    "qwen2-150m": BenchModel("qwen2-150m", 768, 12, 12, 4, 3072, 49152),
    # A tiny Qwen2 for smoke tests.
    "qwen2-tiny": BenchModel("qwen2-tiny", 64, 2, 4, 2, 128, 97),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MODES = ("chain", "tree")
TREE_BRANCHING = 4
SD_STRATEGIES = ("6_4_16", "4_1_4")


# ----- draft-tree shapes -----------------------------------------------------------------------------------


def tree_parents(mode: str, k: int) -> list[int]:
    """Parent of each of the k + 1 nodes (root first): a chain, or a breadth-first tree with 4 children a node."""
    if mode == "chain":
        return [0] + list(range(k))
    if mode == "tree":
        return [0] + [(i - 1) // TREE_BRANCHING for i in range(1, k + 1)]
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def make_tree(mode: str, batch_size: int, k: int, vocab_size: int, generator: torch.Generator) -> DraftTree:
    """A batch of identical-shape draft trees with k draft nodes plus the root and random tokens."""
    parents = tree_parents(mode, k)
    depths = [0] * (k + 1)
    for node in range(1, k + 1):
        depths[node] = depths[parents[node]] + 1
    tokens = torch.randint(3, vocab_size, (batch_size, k + 1), generator=generator)
    return DraftTree(
        tokens=tokens,
        parents=torch.tensor(parents).expand(batch_size, k + 1).clone(),
        depths=torch.tensor(depths).expand(batch_size, k + 1).clone(),
    )


# ----- engine setup ----------------------------------------------------------------------------------------


def load_engine(checkpoint: Path, dtype: torch.dtype, max_num_seqs: int, **kwargs) -> RolloutEngine:
    return RolloutEngine.from_pretrained(str(checkpoint), dtype=dtype, max_num_seqs=max_num_seqs, **kwargs)


def prefill(engine: RolloutEngine, batch_size: int, context_len: int, generator: torch.Generator) -> None:
    """Admit `batch_size` random prompts of `context_len` tokens and run the engine's prefill step on them."""
    vocab_size = engine.model.spec.vocab_size
    prompts = torch.randint(3, vocab_size, (batch_size, context_len), generator=generator).tolist()
    params = SamplingParams(temperature=0, max_tokens=engine.max_model_len, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params)
    engine.step()
    if engine.cache_lens != [context_len] * batch_size:
        raise RuntimeError(f"prefill left cache lengths {engine.cache_lens}, expected {context_len} per row")


def params_m(engine: RolloutEngine) -> float:
    return round(sum(p.numel() for p in engine.model.parameters()) / 1e6, 1)


# ----- verify cost -----------------------------------------------------------------------------------------


def time_verify(
    engine: RolloutEngine, tree: DraftTree, cache_len: int, repeats: int, progress: Progress | None = None
) -> float:
    """Best-of-`repeats` seconds for one target forward (+ logits at every node) verifying `tree`."""
    batch_size = tree.tokens.shape[0]
    lens = torch.full((batch_size,), cache_len, dtype=torch.long)
    engine.cache.ensure_capacity(engine.cache.num_slots, cache_len + tree.num_nodes)
    positions, write_pos, mask = tree_forward_layout(tree, lens)

    def verify() -> None:
        hidden = engine._forward("verify", tree.tokens, positions, 0, write_pos, mask)
        engine.model.logits(hidden)

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
            for k in sorted(set(ks) | {1}):
                tree = make_tree(mode, batch_size, k, vocab_size, generator)
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
    return rows


# ----- SD step overhead ------------------------------------------------------------------------------------


class EmbeddingDrafter(Drafter):
    """A cheap stateless drafter from the target's own weights: embedding -> final norm -> LM head (no layers).

    It asks for the target's hidden states (like an EAGLE head) so the engine's bookkeeping for them is measured,
    but ignores them. Its LM head is applied with F.linear, not `model.logits`, so timing wrappers on the target's
    `logits` never count drafter work as target work.
    """

    uses_hidden_states = True

    def __init__(self, model: torch.nn.Module):
        self.embed, self.norm = model.model.embed_tokens, model.model.norm
        self.head_weight = model.lm_head.weight

    @property
    def vocab_size(self) -> int:
        return self.head_weight.shape[0]

    def begin(self, rows: list[DraftContext]) -> torch.Tensor:
        roots = torch.tensor([row.token_ids[-1] for row in rows], device=self.head_weight.device)
        return self._logits(roots)

    def expand(self, node_ids: torch.Tensor, parent_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self._logits(tokens)

    def _logits(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(self.embed(tokens)), self.head_weight)


@dataclass
class Stopwatch:
    """Seconds accumulated by the calls wrapped with `wrap`."""

    seconds: float = 0.0

    def wrap(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def instrument(engine: RolloutEngine, drafter: Drafter) -> tuple[Stopwatch, Stopwatch]:
    """Wrap the target forward (+ logits) and the drafter calls of `engine` with stopwatches (instance attributes)."""
    target, draft = Stopwatch(), Stopwatch()
    engine._forward = target.wrap(engine._forward)
    engine.model.logits = target.wrap(engine.model.logits)
    drafter.begin = draft.wrap(drafter.begin)
    drafter.expand = draft.wrap(drafter.expand)
    return target, draft


def bench_sd_overhead(checkpoint: Path, strategy: str, context_len: int, steps: int, warmup: int) -> dict:
    """Mean step / target / drafter / overhead times of `steps` speculative steps at batch 1, fp32."""
    engine = load_engine(checkpoint, torch.float32, 1)
    drafter = EmbeddingDrafter(engine.model)
    engine.set_drafter(drafter)
    prefill(engine, 1, context_len, torch.Generator().manual_seed(3))
    for _ in range(warmup):
        engine.step(strategy)
    target, draft = instrument(engine, drafter)
    step_s = 0.0
    for _ in range(steps):
        start = time.perf_counter()
        engine.step(strategy)
        step_s += time.perf_counter() - start
    if not engine.running:
        raise RuntimeError("the request finished during the measured steps; lower the number of steps")
    request = engine.running[0]
    overhead_s = step_s - target.seconds - draft.seconds
    return {
        "strategy": strategy,
        "steps": steps,
        "step_ms": round(step_s / steps * 1e3, 3),
        "target_forward_ms": round(target.seconds / steps * 1e3, 3),
        "drafter_ms": round(draft.seconds / steps * 1e3, 3),
        "overhead_ms": round(overhead_s / steps * 1e3, 3),
        "overhead_fraction": round(overhead_s / step_s, 4),
        # Tokens emitted per verify step (accepted drafts + the bonus token), warm-up steps included.
        "tokens_per_step": round(
            (request.num_accepted_tokens + request.num_verify_steps) / request.num_verify_steps, 3
        ),
    }


def print_sd(entry: dict) -> None:
    print(
        f"sd step {entry['strategy']:>7} bs=1 float32: step {entry['step_ms']:.2f} ms = target "
        f"{entry['target_forward_ms']:.2f} + drafter {entry['drafter_ms']:.2f} + overhead {entry['overhead_ms']:.2f} "
        f"ms ({100 * entry['overhead_fraction']:.1f}% of the step), {entry['tokens_per_step']:.2f} tokens/step",
        flush=True,
    )


# ----- entry point -----------------------------------------------------------------------------------------


def verify_rows(
    checkpoint: Path,
    batch_sizes: list[int],
    ks: list[int],
    dtypes: list[str],
    modes: list[str],
    context_len: int,
    repeats: int,
    progress: Progress | None = None,
) -> list[dict]:
    """Verify-cost rows for every dtype, one engine per dtype (its cache holds max(batch_sizes) rows)."""
    rows = []
    for dtype_name in dtypes:
        engine = load_engine(checkpoint, DTYPES[dtype_name], max(batch_sizes))
        rows += bench_dtype(engine, dtype_name, modes, batch_sizes, ks, context_len, repeats, progress)
        del engine
    return rows


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
) -> dict:
    """Run both measurements, print a line per row, return (and optionally write) the JSON result."""
    spec = MODELS[model]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / spec.name
        build_model(spec, checkpoint)  # saved to disk; the transformers model itself is not needed
        size_m = params_m(load_engine(checkpoint, torch.float32, 1))
        print(f"model {spec.name}: {size_m}M parameters, {torch.get_num_threads()} torch threads", flush=True)
        cells = len(dtypes) * len(batch_sizes) * len(modes) * len(set(ks) | {1}) + len(SD_STRATEGIES)
        progress = Progress("bench verify", cells, unit="measurements")
        rows = verify_rows(checkpoint, batch_sizes, ks, dtypes, modes, context_len, repeats, progress)
        sd = []
        for strategy in SD_STRATEGIES:
            sd.append(bench_sd_overhead(checkpoint, strategy, context_len, sd_steps, sd_warmup))
            progress.advance(extra=f"SD step overhead {strategy}")
            print_sd(sd[-1])
    worst = max(sd, key=lambda entry: entry["overhead_fraction"])
    result = {
        "benchmark": "verify",
        "model": spec.name,
        "params_m": size_m,
        "context_len": context_len,
        "torch_threads": torch.get_num_threads(),
        "timing": "verify: best of repeats after one warm-up; target forward + logits at every node, layout excluded; "
        f"tree mode: breadth-first, {TREE_BRANCHING} children per node",
        "rows": rows,
        "sd_drafter": "target embedding -> final norm -> LM head (no layers), hidden-state bookkeeping on",
        "sd_overhead": sd,
        "sd_overhead_fraction_bs1": worst["overhead_fraction"],
        "sd_overhead_fraction_bs1_source": f"max over strategies: {worst['strategy']} (float32, batch 1)",
        "sd_overhead_fraction_target": 0.10,
    }
    if json_path:
        write_json(json_path, result)
    return result
