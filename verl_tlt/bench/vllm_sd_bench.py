"""`verl-tlt bench sd vllm`: speculative vs plain decoding on vLLM (the engine TLT sets up in verl).

Two engines in one process on the subject's target (`verl_tlt.bench.subject`: the toy by default, or a real
model): a plain one, and a TLT-configured one (the subject's warmed-up drafter as vLLM's EAGLE-1
``speculative_config``, TLT's worker extension and stat logger; see
``verl_tlt.integrations.vllm.local_engine``). Plain decoding is measured on its own engine because vLLM's K=0
still runs the drafter's first pass: on the speculating engine it would not be plain. Per batch size B, `rounds`
batches of B fresh prompts are decoded to completion by both engines in turn (plain, then SD, round by round);
tokens/s summed over the rounds and their ratio are printed and saved, with the greedy outputs compared
(``greedy_identical``) and the acceptance length read from vLLM's spec-decode stats. Ratios from one run.

Four measurements, each interleaving its engines round by round so machine drift hits them alike:
- vLLM's own static SD: one engine per K (``--ks``) with only ``speculative_config`` (K at every step, no
  per-batch-size schedule, no TLT scheduler), against plain at each batch size;
- the tax of vLLM's dynamic SD: an engine whose per-batch-size schedule says K=0 at every batch size (its drafter
  still runs its first pass), against plain at each batch size (vllm#49548 reports +6.6-21.6% TPOT on an H100);
  and the same engine with TLT's deferred first pass (``deferred_first_pass``: no drafter forward on K=0 steps);
- the threshold gate: one engine per K with TLT's schedule (K up to ``--threshold`` running requests, plain above),
  against plain at the batch sizes above the threshold, where it must cost (almost) nothing;
- the long tail: a rollout of ``--long-tail-prompts`` prompts (answers of very different lengths) decoded by plain
  vLLM, each static-K engine, each gated fixed-K engine and the engine with TLT's adaptive K policy
  (``k_scheduler``): TLT's gated and adaptive paths against plain and against the best static K, with the
  acceptance length of each and what catching the drafter up cost (passes, tokens, seconds); the adaptive engine
  also with vLLM's first pass every step, so catch-up's acceptance is measured against a drafter that never fell
  behind, and with the gate at the tail's size (the policy, with plain as an arm, free to speculate at every batch
  size). Every engine decodes one untimed rollout first (the policy learns there too).

TLT's engines (gated, adaptive, deferred K=0) defer the drafter's first pass with ``--catch-up-window`` (default:
``tlt.speculative.vllm_catch_up_window``); vLLM's own engines (static, the K=0 tax) run it every step.
Must run under ``if __name__ == "__main__"`` (vLLM spawns its engine core); the CLI does.
"""

from __future__ import annotations

import math

from verl_tlt.bench.host import host_info
from verl_tlt.bench.subject import BenchSubject
from verl_tlt.config import SpeculativeConfig
from verl_tlt.files import write_json
from verl_tlt.metrics.decode_metrics import overall_acceptance
from verl_tlt.policy import SpeculationGate
from verl_tlt.progress import Progress

PROBLEM_SEED = 777  # different from the drafter's warm-up problems
DEFAULT_CATCH_UP_SWEEP = [16, 64, 256]


def bench_batch(plain, sd, rounds: list[list[list[int]]], max_tokens: int, progress: Progress, label: str) -> dict:
    plain_tokens = sd_tokens = 0
    plain_s = sd_s = 0.0
    identical = True
    sd.take_stats()
    for prompts in rounds:
        base = plain.generate(prompts, max_tokens)
        spec = sd.generate(prompts, max_tokens)
        plain_s, sd_s = plain_s + base.seconds, sd_s + spec.seconds
        plain_tokens += sum(map(len, base.token_ids))
        sd_tokens += sum(map(len, spec.token_ids))
        identical &= base.token_ids == spec.token_ids
        progress.advance(extra=f"{label} bs={len(prompts)}")
    stats = sd.take_stats()
    return {
        "batch_size": len(rounds[0]),
        "rounds": len(rounds),
        "plain_tokens_per_s": round(plain_tokens / plain_s, 1),
        "sd_tokens_per_s": round(sd_tokens / sd_s, 1),
        "speedup": round((sd_tokens / sd_s) / (plain_tokens / plain_s), 3),
        # None where nothing was verified (an engine that never drafts): JSON has no NaN.
        "acceptance_length": round(acceptance, 3) if math.isfinite(acceptance := overall_acceptance(stats)) else None,
        "sd_step_share": round(stats["sd_step_share"], 3),
        "greedy_identical": identical,
    }


class _Setup:
    """The subject's target and drafter, the prompts and the engine options every measurement shares."""

    def __init__(
        self,
        subject: BenchSubject,
        ks: list[int],
        batch_sizes: list[int],
        rounds: int,
        threshold: int,
        tail: int,
        max_len: int,
        catch_up_window: int,
    ):
        self.subject = subject
        self.catch_up_window = catch_up_window
        self.ks, self.rounds, self.threshold, self.tail = ks, rounds, threshold, tail
        self.target, self.drafter = str(subject.target), str(subject.drafter)
        self.max_seqs = max(max(batch_sizes), tail)
        self.prompts = subject.prompts(max(batch_sizes) * rounds + tail * (rounds + 1), PROBLEM_SEED)
        self.tail_prompts = self.prompts[len(self.prompts) - tail * (rounds + 1) :]
        self.common = {"max_num_seqs": self.max_seqs, "max_model_len": max_len}

    def batches(self, batch_size: int) -> list[list[list[int]]]:
        return [self.prompts[r * batch_size : (r + 1) * batch_size] for r in range(self.rounds)]

    def plain_engine(self):
        from verl_tlt.integrations.vllm.local_engine import LocalVllmEngine

        engine = LocalVllmEngine(self.target, **self.common)
        engine.generate(self.prompts[:2], 8)
        return engine

    def sd_engine(
        self, k: int, *, mode: str, defer: bool | None = None, threshold: int | None = None, window: int | None = None
    ):
        """mode static: vLLM's own SD at K=k; gated: TLT's schedule at K=k (plain above the threshold); adaptive
        (k=0): TLT's K policy over every K; tax: a per-batch-size schedule of K=0 everywhere (max K drafted never).
        defer: TLT's deferred first pass (None: on for TLT's modes, off for vLLM's static SD). threshold: the gate's
        (None: the bench's). window: the deferral's (None: the bench's)."""
        from verl_tlt.integrations.vllm.local_engine import LocalVllmEngine

        chains = (k,) if k else tuple(self.ks)
        speculative = SpeculativeConfig(
            threshold=threshold or self.threshold, strategies=tuple(f"{d}_1_{d}" for d in chains)
        )
        deferred = mode != "static" if defer is None else defer
        window = self.catch_up_window if window is None else window
        engine = LocalVllmEngine(
            self.target,
            drafter_dir=self.drafter,
            speculative=speculative,
            schedule=[[1, self.max_seqs, 0]] if mode == "tax" else None,
            adaptive=mode == "adaptive",
            static=mode == "static",
            catch_up_window=window if deferred else 0,
            **self.common,
        )
        engine.generate(self.prompts[:2], 8)
        return engine


def run(
    json_path: str | None,
    ks: list[int],
    batch_sizes: list[int],
    max_tokens: int,
    rounds: int,
    threshold: int,
    subject: BenchSubject,
    *,
    long_tail_prompts: int = 64,
    max_model_len: int = 1024,
    catch_up_window: int | None = None,
    catch_up_sweep: list[int] | None = None,
) -> dict:
    """catch_up_sweep: windows at which the catch-up's cost and acceptance are measured on the long tail (the
    deepest K, gated), against vLLM's first pass every step (None: 16, 64 and 256; empty: not measured)."""
    window = SpeculativeConfig().vllm_catch_up_window if catch_up_window is None else catch_up_window
    sweep = DEFAULT_CATCH_UP_SWEEP if catch_up_sweep is None else catch_up_sweep
    setup = _Setup(subject, ks, batch_sizes, rounds, threshold, long_tail_prompts, max_model_len, window)
    gated_sizes = [b for b in batch_sizes if not SpeculationGate(threshold).speculates(b)]
    progress = Progress(
        "bench sd vllm",
        rounds * ((len(ks) + 2) * len(batch_sizes) + len(ks) * len(gated_sizes) + 1 + (1 if sweep else 0)),
        unit="rounds",
    )
    plain = setup.plain_engine()
    static: dict = {}
    try:
        static = {k: setup.sd_engine(k, mode="static") for k in ks}  # kept for the long tail
        rows = _static_k_rows(setup, plain, static, batch_sizes, max_tokens, progress)
        tax_rows = _dynamic_tax_rows(setup, plain, batch_sizes, max_tokens, progress, defer=False)
        deferred_rows = _dynamic_tax_rows(setup, plain, batch_sizes, max_tokens, progress, defer=True)
        gated_rows, long_tail = _gated_and_long_tail(setup, plain, static, gated_sizes, max_tokens, progress)
        for engine in static.values():
            engine.close()
        static = {}
        catch_up = _catch_up_sweep(setup, plain, sweep, max_tokens, progress) if sweep else None
    finally:
        for engine in (*static.values(), plain):
            engine.close()
    result = _summary(setup, rows, tax_rows, deferred_rows, gated_rows, long_tail, min(batch_sizes), max_tokens)
    result["catch_up_sweep"] = catch_up
    # Acceptance of the drafter caught up at the engines' window against one run every step (same K and schedule).
    result["catch_up_acceptance_ratio"] = None
    if catch_up is not None:
        at_window = [row for row in catch_up["rows"] if row["window"] == window]
        result["catch_up_acceptance_ratio"] = at_window[0]["acceptance_vs_every_step"] if at_window else None
        result["greedy_identical_everywhere"] &= catch_up["every_step"]["greedy_identical"] and all(
            row["greedy_identical"] for row in catch_up["rows"]
        )
        print(_describe_sweep(catch_up), flush=True)
    if json_path:
        write_json(json_path, result)
    return result


def _static_k_rows(
    setup: _Setup, plain, static: dict, batch_sizes: list[int], max_tokens: int, progress: Progress
) -> list[dict]:
    """vLLM's own SD (only `speculative_config`) at each K against plain, per batch size."""
    rows = []
    for k, engine in static.items():
        for batch_size in batch_sizes:
            row = {"k": k, **bench_batch(plain, engine, setup.batches(batch_size), max_tokens, progress, f"K={k}")}
            rows.append(row)
            _print_row(f"static K={k}", row)
    return rows


def _dynamic_tax_rows(
    setup: _Setup, plain, batch_sizes: list[int], max_tokens: int, progress: Progress, *, defer: bool
) -> list[dict]:
    """An engine whose per-batch-size schedule never drafts (K=0 everywhere) against plain: what vLLM's dynamic SD
    costs by itself (defer=False: its drafter's first pass every step), or with TLT's deferred first pass (which,
    with no speculative step to catch up for, runs only when a window fills or a prompt arrives)."""
    engine = setup.sd_engine(max(setup.ks), mode="tax", defer=defer)
    label = "deferred K=0" if defer else "dynamic K=0"
    rows = []
    try:
        for batch_size in batch_sizes:
            row = {"k": 0, **bench_batch(plain, engine, setup.batches(batch_size), max_tokens, progress, label)}
            rows.append(row)
            _print_row(label, row)
    finally:
        engine.close()
    return rows


def _gated_and_long_tail(
    setup: _Setup, plain, static: dict, gated_sizes: list[int], max_tokens: int, progress: Progress
) -> tuple[list[dict], dict]:
    """The gated engines above the threshold, then the long tail on them, on vLLM's static engines and on the
    adaptive engine."""
    gated = {k: setup.sd_engine(k, mode="gated") for k in setup.ks}
    adaptive = setup.sd_engine(0, mode="adaptive")
    always_on = setup.sd_engine(0, mode="adaptive", defer=False)
    # The policy free to speculate at every batch size of the tail (plain is one of its arms): what TLT does where the
    # user's threshold is the engine's batch, as when the drafter pays at any batch size.
    everywhere = setup.sd_engine(0, mode="adaptive", threshold=setup.max_seqs)
    gated_rows = []
    try:
        for k, engine in gated.items():
            for batch_size in gated_sizes:
                row = {"k": k, **bench_batch(plain, engine, setup.batches(batch_size), max_tokens, progress, "gated")}
                gated_rows.append(row)
                _print_row(f"gated K={k}", row)
        engines = {
            **{f"static K={k}": e for k, e in static.items()},
            **{f"gated K={k}": e for k, e in gated.items()},
            "adaptive": adaptive,
            "adaptive, vLLM pass": always_on,
            f"adaptive, threshold {setup.max_seqs}": everywhere,
        }
        long_tail = _long_tail(plain, engines, setup.tail_prompts, setup.tail, max_tokens, progress)
    finally:
        for engine in (*gated.values(), adaptive, always_on, everywhere):
            engine.close()
    return gated_rows, long_tail


def _catch_up_sweep(setup: _Setup, plain, windows: list[int], max_tokens: int, progress: Progress) -> dict:
    """The deepest K, gated, on the long tail: the drafter's first pass every step (vLLM's) against the deferred
    one caught up at each window. One K and one schedule for all, so acceptance compares the caught-up drafter's
    drafts with those of a drafter that ran every step, and tokens/s the catch-up's cost with the tax it saves."""
    k = max(setup.ks)
    reference = f"gated K={k}, vLLM pass"
    engines = {reference: setup.sd_engine(k, mode="gated", defer=False)}
    try:
        for window in windows:
            engines[f"gated K={k}, window {window}"] = setup.sd_engine(k, mode="gated", window=window)
        measured = _long_tail(plain, engines, setup.tail_prompts, setup.tail, max_tokens, progress)
        ring_bytes = {name: e.catch_up_stats()[0].get("ring_bytes", 0) for name, e in engines.items() if e.catch_up}
    finally:
        for engine in engines.values():
            engine.close()
    every_step = measured[reference]
    rows = []
    for window in windows:
        row = measured[f"gated K={k}, window {window}"]
        rows.append(
            {
                "window": window,
                **row,
                "acceptance_vs_every_step": _ratio(row["acceptance_length"], every_step["acceptance_length"]),
                "speed_vs_every_step": _ratio(row["tokens_per_s"], every_step["tokens_per_s"]),
                "ring_bytes": ring_bytes[f"gated K={k}, window {window}"],
            }
        )
    return {"k": k, "every_step": every_step, "plain": measured["plain"], "rows": rows}


def _describe_sweep(sweep: dict) -> str:
    every = sweep["every_step"]
    parts = [
        f"window {r['window']}: acceptance {r['acceptance_length']} ({r['acceptance_vs_every_step']}x), "
        f"{r['speed_vs_every_step']}x the speed, {r['catch_up'].get('catch_ups', 0)} passes / "
        f"{r['catch_up'].get('catch_up_seconds', 0.0):.3f} s, ring {r['ring_bytes'] / 2**20:.2f} MiB"
        for r in sweep["rows"]
    ]
    return (
        f"catch-up on the long tail (gated K={sweep['k']}): drafter run every step {every['tokens_per_s']} tok/s, "
        f"acceptance {every['acceptance_length']}; " + "; ".join(parts)
    )


def _summary(
    setup: _Setup, rows, tax_rows, deferred_rows, gated_rows, long_tail: dict, smallest_batch: int, max_tokens: int
) -> dict:
    at_smallest = [r for r in rows if r["batch_size"] == smallest_batch]
    batch_1 = max(at_smallest, key=lambda r: r["speedup"])

    def best(prefix: str) -> str:
        names = [name for name in long_tail if name.startswith(prefix)]
        return max(names, key=lambda n: long_tail[n]["tokens_per_s"])

    best_static, best_gated = best("static K="), best("gated K=")
    adaptive = long_tail["adaptive"]["tokens_per_s"]
    result = {
        "benchmark": "sd",
        "backend": "vllm",
        "vllm": _vllm_version(),
        **setup.subject.about(),
        **host_info(),
        "dtype": "float32",
        "max_tokens": max_tokens,
        "rounds": setup.rounds,
        "ks": setup.ks,
        "threshold": setup.threshold,
        "best_static_k_at_smallest_batch": batch_1["k"],
        "static_speedup_smallest_batch_best_k": batch_1["speedup"],
        "smallest_batch": smallest_batch,
        "dynamic_k0_speedup_min": min(r["speedup"] for r in tax_rows),
        "dynamic_k0_speedup_max": max(r["speedup"] for r in tax_rows),
        "catch_up_window": setup.catch_up_window,
        "deferred_k0_speedup_min": min(r["speedup"] for r in deferred_rows),
        "deferred_k0_speedup_max": max(r["speedup"] for r in deferred_rows),
        "gated_min_speedup_above_threshold": min((r["speedup"] for r in gated_rows), default=None),
        "long_tail": long_tail,
        "long_tail_best_static": best_static,
        "long_tail_best_gated": best_gated,
        "adaptive_vs_plain": long_tail["adaptive"]["speedup"],
        "adaptive_vs_best_static": round(adaptive / long_tail[best_static]["tokens_per_s"], 3),
        "adaptive_vs_best_gated": round(adaptive / long_tail[best_gated]["tokens_per_s"], 3),
        "adaptive_everywhere_vs_best_static": round(
            long_tail[f"adaptive, threshold {setup.max_seqs}"]["tokens_per_s"] / long_tail[best_static]["tokens_per_s"],
            3,
        ),
        "greedy_identical_everywhere": all(r["greedy_identical"] for r in rows + tax_rows + deferred_rows + gated_rows)
        and all(v["greedy_identical"] for v in long_tail.values()),
        "rows": rows,
        "dynamic_k0_rows": tax_rows,
        "deferred_k0_rows": deferred_rows,
        "gated_rows": gated_rows,
    }
    print(
        f"vLLM static SD, best K at batch {smallest_batch}: {batch_1['k']} ({batch_1['speedup']:.2f}x plain); dynamic "
        f"K=0 everywhere: {result['dynamic_k0_speedup_min']:.2f}-{result['dynamic_k0_speedup_max']:.2f}x plain "
        f"(deferred first pass: {result['deferred_k0_speedup_min']:.2f}-{result['deferred_k0_speedup_max']:.2f}x); "
        f"gated above threshold {setup.threshold}: min {result['gated_min_speedup_above_threshold']}x plain; long "
        f"tail: adaptive {result['adaptive_vs_plain']:.2f}x plain, {result['adaptive_vs_best_static']:.2f}x the best "
        f"static ({best_static}), {result['adaptive_vs_best_gated']:.2f}x the best gated ({best_gated}); "
        f"adaptive at every batch size {result['adaptive_everywhere_vs_best_static']:.2f}x the best static; "
        f"greedy identical everywhere: {result['greedy_identical_everywhere']}",
        flush=True,
    )
    return result


def _long_tail(plain, engines: dict, prompts, size: int, max_tokens: int, progress: Progress) -> dict:
    """Each engine and plain decode the same long-tail rollouts in turn; tokens/s summed over the timed rounds."""
    totals = {name: [0, 0.0] for name in ("plain", *engines)}
    identical = dict.fromkeys(engines, True)
    for index in range(len(prompts) // size):
        batch = prompts[index * size : (index + 1) * size]
        base = plain.generate(batch, max_tokens)
        outputs = {name: engine.generate(batch, max_tokens) for name, engine in engines.items()}
        if index == 0:  # untimed: every engine's first rollout (the adaptive policy explores its arms here)
            before = {name: _catch_up_counts(engine) for name, engine in engines.items()}
            for engine in engines.values():
                engine.take_stats()
            continue
        for name, out in (("plain", base), *outputs.items()):
            totals[name][0] += sum(map(len, out.token_ids))
            totals[name][1] += out.seconds
        for name, out in outputs.items():
            identical[name] &= out.token_ids == base.token_ids
        progress.advance(extra="long tail")
    plain_rate = totals["plain"][0] / totals["plain"][1]
    result = {}
    for name, engine in engines.items():
        rate = totals[name][0] / totals[name][1]
        acceptance = overall_acceptance(engine.take_stats())
        catch_up = {key: value - before[name].get(key, 0) for key, value in _catch_up_counts(engine).items()}
        result[name] = {
            "tokens_per_s": round(rate, 1),
            "speedup": round(rate / plain_rate, 3),
            "acceptance_length": round(acceptance, 3) if math.isfinite(acceptance) else None,
            "catch_up": catch_up,
            "greedy_identical": identical[name],
        }
        print(
            f"long tail ({size} prompts) {name:>19}: {rate:8.1f} tok/s, {rate / plain_rate:.2f}x plain, acceptance "
            f"{result[name]['acceptance_length']}, catch-up {catch_up.get('catch_ups', 0)} passes / "
            f"{catch_up.get('caught_up_tokens', 0)} tokens / {catch_up.get('catch_up_seconds', 0.0):.2f} s",
            flush=True,
        )
    result["plain"] = {"tokens_per_s": round(plain_rate, 1), "speedup": 1.0, "greedy_identical": True}
    return result


def _catch_up_counts(engine) -> dict:
    """The deferral counts of the engine's first worker (``DeferredFirstPass.stats``), numbers only; {} if off."""
    stats = engine.catch_up_stats()[0] if engine.catch_up else {}
    return {key: value for key, value in stats.items() if key not in ("pending_requests", "ring_bytes")}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _print_row(label: str, row: dict) -> None:
    print(
        f"{label:>12} bs={row['batch_size']:>3}: plain {row['plain_tokens_per_s']:>8.1f} tok/s, SD "
        f"{row['sd_tokens_per_s']:>8.1f} tok/s, speedup {row['speedup']:.2f}x, acceptance "
        f"{row['acceptance_length'] or 0:.2f}, SD steps {row['sd_step_share']:.0%}, "
        f"identical {row['greedy_identical']}",
        flush=True,
    )


def _vllm_version() -> str:
    import importlib.metadata as metadata

    return metadata.version("vllm")
