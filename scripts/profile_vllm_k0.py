"""Where a K=0 step's time goes on vLLM: py-spy of the engine core and the worker, plain engine vs TLT's K=0 engine.

Run with vLLM's environment: `.venv-vllm/bin/python scripts/profile_vllm_k0.py [--batch-size 16] [--seconds 15]`.
Two engines in turn decode the same prompts (the toy target, `--rounds` batches of `--batch-size`, up to 512
tokens): plain vLLM, and TLT's engine whose schedule never drafts (K=0 everywhere) with the deferred first pass and
the skipped draft fetch (`--window 0`: vLLM's first pass every step instead; `--fetch-every-step`: the fetch kept).
While each decodes, py-spy samples the engine-core process and the worker process for `--seconds`; the table lists
the functions whose inclusive sample share grew the most. py-spy is installed on first use into `.venv-prof` (a
3 MB wheel from PyPI).
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILER_VENV = ROOT / ".venv-prof"
ROLES = {"EngineCore": "VLLM::EngineCor", "Worker": "VLLM::Worker"}


def py_spy() -> Path:
    binary = PROFILER_VENV / "bin" / "py-spy"
    if not binary.exists():
        print(f"[profile] installing py-spy into {PROFILER_VENV}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PROFILER_VENV)], check=True)
        subprocess.run([str(PROFILER_VENV / "bin" / "pip"), "install", "-q", "py-spy==0.4.3"], check=True)
    return binary


def decode(mode: str, batch_size: int, rounds: int, window: int, fetch_every_step: bool) -> None:
    """The child: one engine decoding `rounds` batches; prints READY once the engine is up, then its tokens/s."""
    from verl_tlt.bench.subject import bench_subject
    from verl_tlt.config import SpeculativeConfig
    from verl_tlt.integrations.vllm.local_engine import LocalVllmEngine

    subject = bench_subject()
    prompts = subject.prompts(batch_size * rounds + 2, 777)
    common = {"max_num_seqs": 64, "max_model_len": 1024}
    if mode == "plain":
        engine = LocalVllmEngine(str(subject.target), **common)
    else:
        speculative = SpeculativeConfig(strategies=("4_1_4",))
        engine = LocalVllmEngine(
            str(subject.target),
            drafter_dir=str(subject.drafter),
            speculative=speculative,
            schedule=[[1, 64, 0]],
            catch_up_window=window,
            skip_empty_draft_fetch=False if fetch_every_step else None,
            **common,
        )
    engine.generate(prompts[:2], 8)
    print("READY", flush=True)
    tokens, seconds = 0, 0.0
    for index in range(rounds):
        out = engine.generate(prompts[2 + index * batch_size : 2 + (index + 1) * batch_size], 512)
        tokens, seconds = tokens + sum(map(len, out.token_ids)), seconds + out.seconds
    print(f"RESULT {mode}: {tokens / seconds:.1f} tok/s", flush=True)
    engine.close()


def profile(mode: str, args: argparse.Namespace, spy: Path, out: Path) -> dict[str, Path]:
    command = [sys.executable, __file__, "--child", mode, "--batch-size", str(args.batch_size)]
    command += ["--rounds", str(args.rounds), "--window", str(args.window)]
    command += ["--fetch-every-step"] if args.fetch_every_step else []
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    for line in child.stdout:
        if line.startswith("READY"):
            break
    pids = {role: _pid_of(name) for role, name in ROLES.items()}
    print(f"[profile] {mode}: sampling {pids} for {args.seconds} s", flush=True)
    recorders = {
        role: subprocess.Popen(
            [str(spy), "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "-d", str(args.seconds)]
            + ["-o", str(out / f"{mode}-{role}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role, pid in pids.items()
    }
    for recorder in recorders.values():
        recorder.wait()
    for line in child.stdout:
        print(f"[profile] {line.strip()}", flush=True)
    if child.wait() != 0:
        raise SystemExit(f"the {mode} engine failed (exit {child.returncode})")
    return {role: out / f"{mode}-{role}.txt" for role in ROLES}


def _pid_of(name: str) -> int:
    listing = subprocess.run(["ps", "-eo", "pid,comm"], capture_output=True, text=True, check=True).stdout
    pids = [int(line.split()[0]) for line in listing.splitlines()[1:] if line.split()[1].startswith(name)]
    if not pids:
        raise SystemExit(f"no {name} process found")
    return max(pids)  # the newest: the engine this run started


def inclusive_shares(path: Path) -> dict[str, float]:
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        total += int(count)
        for frame in {re.sub(r" \((.*?)(:\d+)?\)$", r" (\1)", f) for f in stack.split(";")}:
            counts[frame] += int(count)
    return {frame: n / max(total, 1) for frame, n in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=30, help="batches per engine (enough to outlast --seconds)")
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--window", type=int, default=64, help="the K=0 engine's catch-up window (0: vLLM's pass)")
    parser.add_argument("--fetch-every-step", action="store_true", help="the K=0 engine fetches drafts every step")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", default="/tmp/verl-tlt-k0-profile")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        decode(args.child, args.batch_size, args.rounds, args.window, args.fetch_every_step)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spy = py_spy()
    began = time.time()
    plain, k0 = profile("plain", args, spy, out), profile("k0", args, spy, out)
    for role in ROLES:
        base, other = inclusive_shares(plain[role]), inclusive_shares(k0[role])
        grown = sorted(set(base) | set(other), key=lambda f: other.get(f, 0) - base.get(f, 0), reverse=True)
        print(f"\n{role}: share of samples, plain -> K=0 engine (window {args.window}), biggest increases")
        for frame in grown[: args.top]:
            print(f"  {100 * base.get(frame, 0):5.1f}% -> {100 * other.get(frame, 0):5.1f}%  {frame[:110]}")
    print(f"\n[profile] done in {time.time() - began:.0f} s; raw stacks in {out}")


if __name__ == "__main__":
    main()
