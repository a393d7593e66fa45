"""`verl-tlt bench sd families`: an EAGLE-3 drafter against an EAGLE-1 drafter of the same target, in one run.

What the comparison holds equal: the target, the prompts (fresh problems, apart from the drafters' warm-up data),
the chain depth K, the temperature, batch 1 (one request at a time: the long tail's case), and the engine. Arms:
plain decoding, the EAGLE-1 drafter, the EAGLE-3 drafter, and the EAGLE-1 drafter again (the control: two runs of
one configuration on this machine differ by this much by chance). Prompt by prompt the arms take turns, in an order
that rotates, so machine drift hits them alike.

torch engine: keyed sampling with one seed per prompt, so every arm decodes the same tokens (checked: `identical`)
and acceptance compares on the same text. vLLM (its CPU build, engines set up as TLT sets them up): one engine per
arm; its rejection sampling is not keyed, so at T > 0 the arms decode different samples of the same distribution.

Printed and saved: per arm tokens/s, the acceptance length (tokens committed per verify step, the bonus token
included) and the speedup over plain; the EAGLE-3 / EAGLE-1 ratios of acceptance and of speed; the control's speed
ratio. Ratios from one run. vLLM engines must be built under ``if __name__ == "__main__"``; the CLI does.
"""

from __future__ import annotations

import time
from pathlib import Path

from verl_tlt.bench.host import git_commit, host_info
from verl_tlt.bench.subject import BenchSubject
from verl_tlt.files import write_json
from verl_tlt.progress import Progress

PROBLEM_SEED = 991  # apart from the drafters' warm-up problems and the other benches'
ARMS = ("plain", "eagle", "eagle3", "eagle_repeat")


def run(
    json_path: str | None,
    subject: BenchSubject,
    drafters: dict[str, Path],
    *,
    k: int = 4,
    temperature: float = 1.0,
    num_prompts: int = 16,
    max_tokens: int = 256,
    engine: str = "torch",
) -> dict:
    """Measure the arms on `num_prompts` prompts; print the table; save the result to `json_path` if given.

    drafters: {"eagle": export folder, "eagle3": export folder}."""
    prompts = subject.prompts(num_prompts, PROBLEM_SEED)
    arms = _torch_arms(subject, drafters) if engine == "torch" else _vllm_arms(subject, drafters, k)
    totals = {name: {"tokens": 0, "seconds": 0.0, "steps": 0, "accepted": 0} for name in ARMS}
    identical = True
    progress = Progress(f"bench sd families ({engine})", len(prompts), unit="prompts")
    try:
        for index, prompt in enumerate(prompts):
            order = ARMS[index % len(ARMS) :] + ARMS[: index % len(ARMS)]
            outputs = {}
            for name in order:
                outputs[name] = arms[name](prompt, max_tokens, temperature, k, 1000 + index)
                for key, value in outputs[name]["counts"].items():
                    totals[name][key] += value
            identical &= all(out["token_ids"] == outputs["plain"]["token_ids"] for out in outputs.values())
            progress.advance()
    finally:
        for close in getattr(arms, "closers", []):
            close()
    result = _summary(totals, identical, engine, subject, drafters, k, temperature, num_prompts, max_tokens)
    print(format_table(result))
    if json_path:
        write_json(json_path, result)
    return result


class _Arms(dict):
    closers: list


def _torch_arms(subject: BenchSubject, drafters: dict[str, Path]) -> _Arms:
    from verl_tlt.engine import RolloutEngine, SamplingParams

    arms = _Arms()
    arms.closers = []
    paths = {"plain": None, "eagle": drafters["eagle"], "eagle3": drafters["eagle3"], "eagle_repeat": drafters["eagle"]}
    for name, drafter in paths.items():
        engine = RolloutEngine.from_pretrained(
            str(subject.target), max_num_seqs=1, sampling="keyed", drafter=str(drafter) if drafter else None
        )

        def decode(prompt, max_tokens, temperature, k, seed, engine=engine, speculative=drafter is not None):
            params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
            begin = time.perf_counter()
            (output,) = engine.generate([prompt], params, strategy=f"{k}_1_{k}" if speculative else None)
            seconds = time.perf_counter() - begin
            stats = output.stats
            counts = {
                "tokens": len(output.token_ids),
                "seconds": seconds,
                "steps": int(stats.get("num_verify_steps", 0)),
                "accepted": int(stats.get("num_accepted_tokens", 0)),
            }
            return {"token_ids": output.token_ids, "counts": counts}

        arms[name] = decode
    return arms


def _vllm_arms(subject: BenchSubject, drafters: dict[str, Path], k: int) -> _Arms:
    from verl_tlt.config import SpeculativeConfig
    from verl_tlt.integrations.vllm.local_engine import LocalVllmEngine

    arms = _Arms()
    arms.closers = []
    speculative = SpeculativeConfig(threshold=1, strategies=(f"{k}_1_{k}",))
    paths = {"plain": None, "eagle": drafters["eagle"], "eagle3": drafters["eagle3"], "eagle_repeat": drafters["eagle"]}
    for name, drafter in paths.items():
        if drafter is None:
            engine = LocalVllmEngine(str(subject.target), max_num_seqs=4)
        else:
            engine = LocalVllmEngine(
                str(subject.target), drafter_dir=str(drafter), speculative=speculative, max_num_seqs=4
            )
        arms.closers.append(engine.close)

        def decode(prompt, max_tokens, temperature, k, seed, engine=engine):
            engine.take_stats()
            generation = engine.generate([prompt], max_tokens, temperature=temperature, seed=seed)
            stats = engine.take_stats()
            steps = sum(stats["sd_rows_by_strategy"].values())  # verified rows (batch 1: steps)
            committed = sum(stats["sd_tokens_by_strategy"].values())  # accepted drafts + one token per row
            counts = {
                "tokens": len(generation.token_ids[0]),
                "seconds": generation.seconds,
                "steps": steps,
                "accepted": committed - steps,
            }
            return {"token_ids": generation.token_ids[0], "counts": counts}

        arms[name] = decode
    return arms


def _summary(totals, identical, engine, subject, drafters, k, temperature, num_prompts, max_tokens) -> dict:
    rows = {}
    plain_rate = totals["plain"]["tokens"] / totals["plain"]["seconds"]
    for name, total in totals.items():
        rate = total["tokens"] / total["seconds"]
        row = {"tokens": total["tokens"], "seconds": round(total["seconds"], 2), "tokens_per_s": round(rate, 2)}
        if name != "plain":
            steps = max(total["steps"], 1)
            row["acceptance_length"] = round((total["accepted"] + total["steps"]) / steps, 3)
            row["speedup"] = round(rate / plain_rate, 3)
            # What one speculative step costs (drafting K tokens, verifying, committing): speed = acceptance / this.
            row["ms_per_step"] = round(1000 * total["seconds"] / steps, 3)
        rows[name] = row
    eagle, eagle3 = rows["eagle"], rows["eagle3"]
    return {
        "bench": "sd families",
        "engine": engine,
        "host": host_info(),
        "commit": git_commit(),
        "subject": subject.about(),
        "drafters": {name: str(path) for name, path in drafters.items()},
        "k": k,
        "temperature": temperature,
        "prompts": num_prompts,
        "max_tokens": max_tokens,
        "identical": identical,
        "arms": rows,
        "eagle3_over_eagle": {
            "acceptance_length": round(eagle3["acceptance_length"] / eagle["acceptance_length"], 3),
            "tokens_per_s": round(eagle3["tokens_per_s"] / eagle["tokens_per_s"], 3),
            "ms_per_step": round(eagle3["ms_per_step"] / eagle["ms_per_step"], 3),
        },
        "control_speed_ratio": round(rows["eagle_repeat"]["tokens_per_s"] / eagle["tokens_per_s"], 3),
    }


def format_table(result: dict) -> str:
    lines = [
        f"bench sd families on {result['engine']}: {result['subject']['model']}, K={result['k']} chains, "
        f"T={result['temperature']:g}, batch 1, {result['prompts']} prompts; identical outputs: {result['identical']}",
        f"{'arm':>14} {'tok/s':>8} {'acceptance':>10} {'speedup':>8} {'ms/SD step':>10}",
    ]
    for name, row in result["arms"].items():
        acceptance = f"{row['acceptance_length']:.2f}" if "acceptance_length" in row else "-"
        speedup = f"{row['speedup']:.2f}x" if "speedup" in row else "-"
        step = f"{row['ms_per_step']:.2f}" if "ms_per_step" in row else "-"
        lines.append(f"{name:>14} {row['tokens_per_s']:8.1f} {acceptance:>10} {speedup:>8} {step:>10}")
    ratio = result["eagle3_over_eagle"]
    lines.append(
        f"EAGLE-3 / EAGLE-1: acceptance {ratio['acceptance_length']:.2f}x, speed {ratio['tokens_per_s']:.2f}x, cost of "
        f"an SD step {ratio['ms_per_step']:.2f}x; control (EAGLE-1 again / EAGLE-1) speed "
        f"{result['control_speed_ratio']:.2f}x"
    )
    return "\n".join(lines)
