"""`verl-tlt bench sd curve`: speculative vs plain decoding with the torch engine on a target and its drafter.

The subject (`verl_tlt.bench.subject`): the trained toy target by default, or a real model, each with its cached
warm-up drafter. For each strategy and batch size B, `rounds` batches of B fresh prompts are decoded to completion
(natural EOS, max_tokens cap), each once plainly and once speculatively on the same engine object, one after the
other; tokens/s of each, summed over the rounds, and their ratio are printed. The curve is greedy by default: both
runs then produce the same tokens (checked, `greedy_identical`), so the ratio compares equal work; at T=1 the two
runs draw different samples whose lengths differ, and with few requests the longest one dominates. Acceptance length
(tokens per verify step including the bonus token) comes from the engine's per-request SD stats, at batch 1, greedy
and T=1. Ratios from one run.
"""

from __future__ import annotations

import time

from verl_tlt.bench.drafting_cost import drafting_cost, print_drafting_cost
from verl_tlt.bench.host import host_info
from verl_tlt.bench.self_test_cost import print_self_test_cost, self_test_cost
from verl_tlt.bench.subject import BenchSubject
from verl_tlt.engine import CompletionOutput, RolloutEngine, SamplingParams
from verl_tlt.engine.config import EngineConfig
from verl_tlt.files import write_json
from verl_tlt.progress import Progress

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
PROBLEM_SEED = 777  # different from the drafter's warm-up problems


def acceptance_length(outputs: list[CompletionOutput]) -> float:
    steps = sum(o.stats["num_verify_steps"] for o in outputs)
    accepted = sum(o.stats["num_accepted_tokens"] for o in outputs)
    return (accepted + steps) / steps if steps else float("nan")


def timed_generate(
    engine: RolloutEngine, prompts, params, strategy, groups=None
) -> tuple[list[CompletionOutput], float]:
    start = time.perf_counter()
    outputs = engine.generate(prompts, params, strategy=strategy, groups=groups)
    return outputs, time.perf_counter() - start


def bench_batch(engine, rounds: list[list[list[int]]], params, strategy, progress: Progress | None = None) -> dict:
    """Plain vs speculative decoding of `rounds` (each a batch of prompts), the two taking turns round by round.

    Tokens and seconds are summed over the rounds: one short batch is over in milliseconds, so several rounds of
    fresh prompts make the ratio less hostage to one answer's length and to a single slow moment. `progress` advances
    by one after each round, between the timed calls.
    """
    plain_tokens = spec_tokens = 0
    plain_s = spec_s = 0.0
    identical = True
    spec_outputs: list[CompletionOutput] = []
    for prompts in rounds:
        engine.max_num_seqs = len(prompts)
        plain, seconds = timed_generate(engine, prompts, params, None)
        plain_s += seconds
        spec, seconds = timed_generate(engine, prompts, params, strategy)
        spec_s += seconds
        plain_tokens += sum(len(o.token_ids) for o in plain)
        spec_tokens += sum(len(o.token_ids) for o in spec)
        identical &= [o.token_ids for o in plain] == [o.token_ids for o in spec]
        spec_outputs += spec
        if progress is not None:
            progress.advance(extra=f"{strategy} bs={len(prompts)}")
    row = {
        "batch_size": len(rounds[0]),
        "rounds": len(rounds),
        "plain_tokens_per_s": round(plain_tokens / plain_s, 1),
        "sd_tokens_per_s": round(spec_tokens / spec_s, 1),
        "speedup": round((spec_tokens / spec_s) / (plain_tokens / plain_s), 3),
        "acceptance_length": round(acceptance_length(spec_outputs), 3),
    }
    if params.temperature == 0:
        row["greedy_identical"] = identical
    return row


def run(
    json_path: str | None,
    strategies: list[str],
    batch_sizes: list[int],
    temperature: float,
    max_tokens: int,
    acceptance_prompts: int,
    subject: BenchSubject,
    rounds: int = 4,
    *,
    device: str = "cpu",
    compile: bool = False,
    cuda_graphs: bool = False,
    sampling: str = "keyed",
) -> dict:
    config = EngineConfig(max_num_seqs=max(batch_sizes), compile=compile, cuda_graphs=cuda_graphs, sampling=sampling)
    engine = RolloutEngine.from_pretrained(
        str(subject.target), config=config, drafter=str(subject.drafter), device=device
    )
    prompts = subject.prompts(max(max(batch_sizes) * rounds, acceptance_prompts), PROBLEM_SEED)
    engine.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=8), strategy=strategies[0])  # warm-up
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=0)
    if compile or cuda_graphs:
        _compile_warm_up(engine, prompts, params, strategies, batch_sizes)
    acceptance = {
        strategy: measure_acceptance(engine, prompts[:acceptance_prompts], strategy, max_tokens)
        for strategy in strategies
    }
    rows = _speedup_curve(engine, prompts, params, strategies, batch_sizes, rounds)
    cost = drafting_cost(engine, strategies)
    print_drafting_cost(cost)
    self_test = self_test_cost(engine, prompts[0])
    print_self_test_cost(self_test)
    result = {
        "benchmark": "sd",
        **subject.about(),
        **host_info(),
        "strategies": strategies,
        "curve_temperature": temperature,
        "max_tokens": max_tokens,
        "rounds": rounds,
        "device": device,
        "compiled": compile,
        "sampling": sampling,
        "cuda_graphs": engine.runner.graphs.memory_report() if engine.runner.graphs is not None else None,
        "dtype": str(engine.dtype).removeprefix("torch."),
        # Headline acceptance lengths: the first (deepest by default) strategy, batch 1.
        "acceptance_length_greedy": acceptance[strategies[0]]["greedy"],
        "acceptance_length_t1": acceptance[strategies[0]]["t1"],
        "acceptance_by_strategy": acceptance,
        "acceptance_prompts": acceptance_prompts,
        "rows": rows,
        # Drafter time per draft token over the draft vocabulary vs the full head (None without a draft vocabulary).
        "drafting_cost": cost,
        # Seconds of one drafter self-test check on this engine (bench/self_test_cost.py).
        "self_test_cost": self_test,
    }
    if json_path:
        write_json(json_path, result)
    return result


def _compile_warm_up(engine: RolloutEngine, prompts, params, strategies: list[str], batch_sizes: list[int]) -> None:
    """Dynamo recompiles on first meeting some shape relations (batch vs cache rows, KV length at the cache's end);
    one untimed pass over every batch size and strategy keeps those compiles (and the CUDA-graph captures) out of the
    timed runs."""
    warm_up = Progress("bench sd, compile warm-up", len(batch_sizes) * (1 + len(strategies)), unit="passes")
    for batch_size in batch_sizes:
        engine.max_num_seqs = batch_size
        for strategy in (None, *strategies):
            engine.generate(prompts[:batch_size], params, strategy=strategy)
            warm_up.advance()


def _speedup_curve(engine: RolloutEngine, prompts, params, strategies: list[str], batch_sizes: list[int], rounds: int):
    rows = []
    curve = Progress("bench sd, speedup curve", len(strategies) * len(batch_sizes) * rounds, unit="rounds")
    for strategy in strategies:
        for batch_size in batch_sizes:
            batches = [prompts[r * batch_size : (r + 1) * batch_size] for r in range(rounds)]
            row = {"strategy": strategy, **bench_batch(engine, batches, params, strategy, curve)}
            rows.append(row)
            print(
                f"{strategy:>7} bs={batch_size:>3}: plain {row['plain_tokens_per_s']:>8.1f} tok/s, SD "
                f"{row['sd_tokens_per_s']:>8.1f} tok/s, speedup {row['speedup']:.2f}x, acceptance "
                f"{row['acceptance_length']:.2f}",
                flush=True,
            )
    return rows


def measure_acceptance(engine: RolloutEngine, prompts, strategy: str, max_tokens: int) -> dict[str, float]:
    """Tokens per verify step (incl. bonus) at batch 1, greedy and T=1."""
    result = {}
    engine.max_num_seqs = 1
    for name, temperature in (("greedy", 0.0), ("t1", 1.0)):
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        progress = Progress(f"bench sd, acceptance {strategy} {name}", len(prompts), unit="answers")
        outputs = engine.generate(prompts, params, strategy=strategy, progress=progress)  # untimed: only acceptance
        result[name] = round(acceptance_length(outputs), 3)
        print(f"acceptance length ({name}, batch 1, {strategy}): {result[name]:.2f}", flush=True)
    return result
