"""`verl-tlt bench sd --backend vllm`: speculative vs plain decoding on vLLM (the engine TLT sets up in verl).

Two engines in one process on the cached toy target: a plain one, and a TLT-configured one (the warmed-up toy
drafter as vLLM's EAGLE-1 ``speculative_config``, TLT's worker extension and stat logger; see
``verl_tlt.integrations.vllm.local_engine``). Plain decoding is measured on its own engine because vLLM's K=0
still runs the drafter's first pass: on the speculating engine it would not be plain. Per batch size B, `rounds`
batches of B fresh toy prompts are decoded to completion by both engines in turn (plain, then SD, round by round);
tokens/s summed over the rounds and their ratio are printed and saved, with the greedy outputs compared
(``greedy_identical``) and the acceptance length read from vLLM's spec-decode stats. Ratios from one run.

Two sweeps:
- fixed K: one SD engine per K (``--ks``), speculating at every batch size;
- the threshold gate: one SD engine with TLT's schedule (the best fixed K at batch 1 up to ``--threshold`` running
  requests, plain above), measured at the batch sizes above the threshold, where it must cost (almost) nothing.
Must run under ``if __name__ == "__main__"`` (vLLM spawns its engine core); the CLI does.
"""

from __future__ import annotations

from verl_tlt.config import SpeculativeConfig
from verl_tlt.files import write_json
from verl_tlt.progress import Progress

PROBLEM_SEED = 777  # different from the drafter's warm-up problems


def _acceptance(stats: dict) -> float:
    rows = sum(stats["sd_rows_by_strategy"].values())
    return sum(stats["sd_tokens_by_strategy"].values()) / rows if rows else float("nan")


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
        "acceptance_length": round(_acceptance(stats), 3),
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
    max_model_len: int = 1024,
) -> dict:
    from verl_tlt.integrations.vllm.local_engine import LocalVllmEngine
    from verl_tlt.toy.drafter import ensure_toy_drafter, toy_prompts
    from verl_tlt.toy.sft import ensure_toy_target

    target, drafter = str(ensure_toy_target()), str(ensure_toy_drafter())
    max_seqs = max(batch_sizes)
    prompts = toy_prompts(target, max_seqs * rounds, PROBLEM_SEED)
    warm_up = prompts[:2]

    def batches(batch_size: int) -> list[list[list[int]]]:
        return [prompts[r * batch_size : (r + 1) * batch_size] for r in range(rounds)]

    gated_sizes = [b for b in batch_sizes if b > threshold]
    progress = Progress(
        "bench sd (vLLM)", rounds * (len(ks) * len(batch_sizes) + len(gated_sizes)), unit="rounds"
    )
    plain = LocalVllmEngine(target, max_num_seqs=max_seqs, max_model_len=max_model_len)
    plain.generate(warm_up, 8)
    rows = []
    try:
        for k in ks:
            sd = LocalVllmEngine(
                target, drafter_dir=drafter, max_num_seqs=max_seqs, max_model_len=max_model_len,
                speculative=SpeculativeConfig(strategies=(f"{k}_1_{k}",)), schedule=[[1, max_seqs, k]],
            )
            try:
                sd.generate(warm_up, 8)
                for batch_size in batch_sizes:
                    row = {"k": k, **bench_batch(plain, sd, batches(batch_size), max_tokens, progress, f"K={k}")}
                    rows.append(row)
                    _print_row(f"K={k}", row)
            finally:
                sd.close()
        best_k = max((r for r in rows if r["batch_size"] == min(batch_sizes)), key=lambda r: r["speedup"])["k"]
        gated_rows = []
        if gated_sizes:
            speculative = SpeculativeConfig(threshold=threshold, strategies=(f"{best_k}_1_{best_k}",))
            sd = LocalVllmEngine(
                target, drafter_dir=drafter, max_num_seqs=max_seqs, max_model_len=max_model_len, speculative=speculative
            )
            try:
                sd.generate(warm_up, 8)
                for batch_size in gated_sizes:
                    row = bench_batch(plain, sd, batches(batch_size), max_tokens, progress, "gated")
                    gated_rows.append(row)
                    _print_row(f"gated(thr={threshold})", row)
            finally:
                sd.close()
    finally:
        plain.close()
    best = max((r for r in rows if r["k"] == best_k), key=lambda r: -r["batch_size"])
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
        "best_k_at_batch_1": best_k,
        "speedup_batch_1_best_k": best.get("speedup") if best["batch_size"] == 1 else None,
        "threshold": threshold,
        "gated_min_speedup_above_threshold": min((r["speedup"] for r in gated_rows), default=None),
        "greedy_identical_everywhere": all(r["greedy_identical"] for r in rows + gated_rows),
        "rows": rows,
        "gated_rows": gated_rows,
    }
    print(
        f"best K at batch {min(batch_sizes)}: {best_k} ({best['speedup']:.2f}x); gated schedule above threshold "
        f"{threshold}: min {result['gated_min_speedup_above_threshold']}x; greedy identical everywhere: "
        f"{result['greedy_identical_everywhere']}",
        flush=True,
    )
    if json_path:
        write_json(json_path, result)
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
