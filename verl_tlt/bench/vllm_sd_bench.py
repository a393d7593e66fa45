"""`verl-tlt bench sd vllm`: speculative vs plain decoding on vLLM (the engine TLT sets up in verl).

Two engines in one process on the cached toy target: a plain one, and a TLT-configured one (the warmed-up toy
drafter as vLLM's EAGLE-1 ``speculative_config``, TLT's worker extension and stat logger; see
``verl_tlt.integrations.vllm.local_engine``). Plain decoding is measured on its own engine because vLLM's K=0
still runs the drafter's first pass: on the speculating engine it would not be plain. Per batch size B, `rounds`
batches of B fresh toy prompts are decoded to completion by both engines in turn (plain, then SD, round by round);
tokens/s summed over the rounds and their ratio are printed and saved, with the greedy outputs compared
(``greedy_identical``) and the acceptance length read from vLLM's spec-decode stats. Ratios from one run.

Three measurements, each interleaving its engines round by round so machine drift hits them alike:
- fixed K: one SD engine per K (``--ks``), speculating at every batch size, against plain at each batch size;
- the threshold gate: one engine per K with TLT's schedule (K up to ``--threshold`` running requests, plain above),
  against plain at the batch sizes above the threshold, where it must cost (almost) nothing;
- the long tail: a rollout of ``--long-tail-prompts`` toy prompts (answers of very different lengths) decoded by
  each gated fixed-K engine and by the engine with TLT's adaptive K policy (``k_scheduler``); the policy's tokens/s
  against the best fixed K's. Every engine decodes one untimed rollout first (the policy learns there too).
Must run under ``if __name__ == "__main__"`` (vLLM spawns its engine core); the CLI does.
"""

from __future__ import annotations

from verl_tlt.config import SpeculativeConfig
from verl_tlt.files import write_json
from verl_tlt.policy import SpeculationGate
from verl_tlt.policy.decode_stats import overall_acceptance
from verl_tlt.progress import Progress

PROBLEM_SEED = 777  # different from the drafter's warm-up problems


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
        "acceptance_length": round(overall_acceptance(stats), 3),
        "sd_step_share": round(stats["sd_step_share"], 3),
        "greedy_identical": identical,
    }


def run(
    json_path: str | None,
    ks: list[int],
    batch_sizes: list[int],
    max_tokens: int,
    rounds: int,
    threshold: int,
    *,
    long_tail_prompts: int = 64,
    max_model_len: int = 1024,
) -> dict:
    from verl_tlt.integrations.vllm.local_engine import LocalVllmEngine
    from verl_tlt.toy.drafter import ensure_toy_drafter, toy_prompts
    from verl_tlt.toy.sft import ensure_toy_target

    target, drafter = str(ensure_toy_target()), str(ensure_toy_drafter())
    max_seqs = max(max(batch_sizes), long_tail_prompts)
    prompts = toy_prompts(target, max(batch_sizes) * rounds + long_tail_prompts * (rounds + 1), PROBLEM_SEED)
    tail_prompts = prompts[len(prompts) - long_tail_prompts * (rounds + 1) :]
    common = {"max_num_seqs": max_seqs, "max_model_len": max_model_len}

    def batches(batch_size: int) -> list[list[list[int]]]:
        return [prompts[r * batch_size : (r + 1) * batch_size] for r in range(rounds)]

    def sd_engine(k: int, *, gated: bool, adaptive: bool = False) -> LocalVllmEngine:
        chains = (k,) if k else tuple(ks)
        speculative = SpeculativeConfig(threshold=threshold, strategies=tuple(f"{d}_1_{d}" for d in chains))
        schedule = None if gated else [[1, max_seqs, k]]
        engine = LocalVllmEngine(
            target, drafter_dir=drafter, speculative=speculative, schedule=schedule, adaptive=adaptive, **common
        )
        engine.generate(prompts[:2], 8)
        return engine

    gate = SpeculationGate(threshold)
    gated_sizes = [b for b in batch_sizes if not gate.speculates(b)]
    progress = Progress(
        "bench sd vllm",
        rounds * (len(ks) * len(batch_sizes) + len(ks) * len(gated_sizes) + 1),
        unit="rounds",
    )
    plain = LocalVllmEngine(target, **common)
    plain.generate(prompts[:2], 8)
    rows, gated_rows = [], []
    try:
        for k in ks:  # fixed K at every batch size
            engine = sd_engine(k, gated=False)
            try:
                for batch_size in batch_sizes:
                    row = {"k": k, **bench_batch(plain, engine, batches(batch_size), max_tokens, progress, f"K={k}")}
                    rows.append(row)
                    _print_row(f"K={k}", row)
            finally:
                engine.close()
        best_k = max((r for r in rows if r["batch_size"] == min(batch_sizes)), key=lambda r: r["speedup"])["k"]
        gated = {k: sd_engine(k, gated=True) for k in ks}
        adaptive = sd_engine(0, gated=True, adaptive=True)
        try:
            for k, engine in gated.items():  # the gate above the threshold
                for batch_size in gated_sizes:
                    row = {"k": k, **bench_batch(plain, engine, batches(batch_size), max_tokens, progress, "gated")}
                    gated_rows.append(row)
                    _print_row(f"gated K={k}", row)
            long_tail = _long_tail(
                plain,
                {**{f"K={k}": e for k, e in gated.items()}, "adaptive": adaptive},
                tail_prompts,
                long_tail_prompts,
                max_tokens,
                progress,
            )
        finally:
            for engine in (*gated.values(), adaptive):
                engine.close()
    finally:
        plain.close()
    best_fixed = max((name for name in long_tail if name.startswith("K=")), key=lambda n: long_tail[n]["tokens_per_s"])
    batch_1 = next(r for r in rows if r["k"] == best_k and r["batch_size"] == min(batch_sizes))
    result = {
        "benchmark": "sd",
        "backend": "vllm",
        "vllm": _vllm_version(),
        "target": target,
        "drafter": drafter,
        "dtype": "float32",
        "max_tokens": max_tokens,
        "rounds": rounds,
        "ks": ks,
        "threshold": threshold,
        "best_k_at_smallest_batch": best_k,
        "speedup_smallest_batch_best_k": batch_1["speedup"],
        "smallest_batch": batch_1["batch_size"],
        "gated_min_speedup_above_threshold": min((r["speedup"] for r in gated_rows), default=None),
        "long_tail": long_tail,
        "long_tail_best_fixed": best_fixed,
        "adaptive_vs_best_fixed": round(
            long_tail["adaptive"]["tokens_per_s"] / long_tail[best_fixed]["tokens_per_s"], 3
        ),
        "greedy_identical_everywhere": all(r["greedy_identical"] for r in rows + gated_rows)
        and all(v["greedy_identical"] for v in long_tail.values()),
        "rows": rows,
        "gated_rows": gated_rows,
    }
    print(
        f"best K at batch {batch_1['batch_size']}: {best_k} ({batch_1['speedup']:.2f}x plain); gated engines above "
        f"threshold {threshold}: min {result['gated_min_speedup_above_threshold']}x plain; long tail: adaptive "
        f"{result['adaptive_vs_best_fixed']:.2f}x the best fixed ({best_fixed}), "
        f"{long_tail['adaptive']['speedup']:.2f}x plain; greedy identical everywhere: "
        f"{result['greedy_identical_everywhere']}",
        flush=True,
    )
    if json_path:
        write_json(json_path, result)
    return result


def _long_tail(plain, engines: dict, prompts, size: int, max_tokens: int, progress: Progress) -> dict:
    """Each engine and plain decode the same long-tail rollouts in turn; tokens/s summed over the timed rounds."""
    totals = {name: [0, 0.0] for name in ("plain", *engines)}
    identical = dict.fromkeys(engines, True)
    for index in range(len(prompts) // size):
        batch = prompts[index * size : (index + 1) * size]
        base = plain.generate(batch, max_tokens)
        outputs = {name: engine.generate(batch, max_tokens) for name, engine in engines.items()}
        if index == 0:
            continue  # untimed: every engine's first rollout (the adaptive policy explores its arms here)
        for name, out in (("plain", base), *outputs.items()):
            totals[name][0] += sum(map(len, out.token_ids))
            totals[name][1] += out.seconds
        for name, out in outputs.items():
            identical[name] &= out.token_ids == base.token_ids
        progress.advance(extra="long tail")
    plain_rate = totals["plain"][0] / totals["plain"][1]
    result = {}
    for name in engines:
        rate = totals[name][0] / totals[name][1]
        result[name] = {
            "tokens_per_s": round(rate, 1),
            "speedup": round(rate / plain_rate, 3),
            "greedy_identical": identical[name],
        }
        print(f"long tail ({size} prompts) {name:>9}: {rate:8.1f} tok/s, {rate / plain_rate:.2f}x plain", flush=True)
    result["plain"] = {"tokens_per_s": round(plain_rate, 1), "speedup": 1.0, "greedy_identical": True}
    return result


def _print_row(label: str, row: dict) -> None:
    print(
        f"{label:>12} bs={row['batch_size']:>3}: plain {row['plain_tokens_per_s']:>8.1f} tok/s, SD "
        f"{row['sd_tokens_per_s']:>8.1f} tok/s, speedup {row['speedup']:.2f}x, acceptance "
        f"{row['acceptance_length']:.2f}, SD steps {row['sd_step_share']:.0%}, identical {row['greedy_identical']}",
        flush=True,
    )


def _vllm_version() -> str:
    import importlib.metadata as metadata

    return metadata.version("vllm")
