"""`verl-tlt bench sd vllm` on real vLLM (the CPU build), at toy size: it runs, checks greedy identity,
and reports every ratio it promises. The numbers themselves are measured by the full command (docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from tests.vllm_toy_drafter import vllm_tier_drafter  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]  # the toy builds (cached after the first run) + the bench


@pytest.fixture
def toy_drafter():
    """Build (or find) the toy target and the vLLM tier's drafter before the bench's timed run, so the timeout bounds
    the bench alone and not, on an empty cache, the minutes of toy training in front of it."""
    from verl_tlt.toy.sft import ensure_toy_target

    ensure_toy_target()
    return vllm_tier_drafter()


def test_the_vllm_sd_bench_reports_every_ratio_with_greedy_identity(tmp_path, toy_drafter):
    out = tmp_path / "sd.json"
    command = [
        sys.executable,
        "-m",
        "verl_tlt.cli",
        "bench",
        "sd",
        "vllm",
        "--ks",
        "4",
        "--batch-sizes",
        "1",
        "4",
        "--threshold",
        "2",
        "--rounds",
        "1",
        "--max-tokens",
        "48",
        "--long-tail-prompts",
        "8",
        "--catch-up-sweep",
        "64",
        "--drafter",
        str(toy_drafter),
        "--json",
        str(out),
    ]
    run_with_traceback_on_timeout(command, tmp_path / "bench.log", timeout_s=780)
    result = json.loads(out.read_text())
    # One K keeps the engines to ten (plain, vLLM's static K, the K=0 tax with vLLM's pass and with TLT's deferred
    # one, TLT's gated K, adaptive with and without deferral, adaptive at every batch size, gated K with vLLM's pass
    # and at one catch-up window): each vLLM engine start costs tens of seconds on 2 cores. The adaptive policy
    # still chooses, between K=4 and plain.
    assert result["backend"] == "vllm" and result["ks"] == [4]
    assert [(r["k"], r["batch_size"]) for r in result["rows"]] == [(4, 1), (4, 4)]
    assert [(r["k"], r["batch_size"]) for r in result["dynamic_k0_rows"]] == [(0, 1), (0, 4)]
    assert [(r["k"], r["batch_size"]) for r in result["deferred_k0_rows"]] == [(0, 1), (0, 4)]
    # The gated engine, at the batch sizes above the threshold.
    assert [(r["k"], r["batch_size"]) for r in result["gated_rows"]] == [(4, 4)]
    assert result["greedy_identical_everywhere"] is True
    for row in result["rows"] + result["gated_rows"] + result["dynamic_k0_rows"] + result["deferred_k0_rows"]:
        assert row["speedup"] > 0 and row["plain_tokens_per_s"] > 0
    assert all(r["acceptance_length"] > 1.5 for r in result["rows"])  # the warmed-up drafter is accepted
    assert all(
        r["sd_step_share"] == 0 and r["acceptance_length"] is None
        for r in result["dynamic_k0_rows"] + result["deferred_k0_rows"]
    )  # never a draft
    assert all(r["sd_step_share"] < 0.5 for r in result["gated_rows"])  # above the threshold: mostly plain steps
    assert result["best_static_k_at_smallest_batch"] == 4 and result["smallest_batch"] == 1
    assert set(result["long_tail"]) == {
        "static K=4",
        "gated K=4",
        "adaptive",
        "adaptive, vLLM pass",
        "adaptive, threshold 8",
        "plain",
    }
    # TLT's engines deferred their first pass above the threshold; vLLM's own engines have no deferral.
    assert result["long_tail"]["adaptive"]["catch_up"]["deferred_steps"] > 0
    assert result["long_tail"]["adaptive, vLLM pass"]["catch_up"] == {}
    assert result["long_tail"]["static K=4"]["catch_up"] == {}
    # The catch-up sweep: gated K=4 with vLLM's pass every step against the deferred one at window 64, one schedule,
    # so the caught-up drafter drafts what the drafter run every step does (numerics aside).
    sweep = result["catch_up_sweep"]
    assert sweep["k"] == 4 and [row["window"] for row in sweep["rows"]] == [64]
    (row,) = sweep["rows"]
    assert row["catch_up"]["catch_ups"] > 0 and row["ring_bytes"] > 0 and row["speed_vs_every_step"] > 0
    assert sweep["every_step"]["catch_up"] == {}
    assert result["catch_up_window"] == 64 and result["catch_up_acceptance_ratio"] >= 0.9
    assert result["adaptive_everywhere_vs_best_static"] > 0
    assert result["long_tail_best_static"] == "static K=4" and result["adaptive_vs_best_static"] > 0
    assert result["long_tail_best_gated"] == "gated K=4" and result["adaptive_vs_best_gated"] > 0
    assert result["dynamic_k0_speedup_min"] > 0


def run_with_traceback_on_timeout(command: list[str], log_path, timeout_s: float) -> None:
    """Run `command` in its own process group; on failure or timeout, fail with its log's tail, and on timeout
    first have Python dump every thread's stack there (faulthandler), so a hung engine shows where it hung."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)  # faulthandler writes the stacks, then the process dies
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            try:  # vLLM's engine processes outlive the bench: the whole group goes
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:  # nothing of the group was left
                pass
            process.wait()
            returncode = None
    lines = [line for line in log_path.read_text().splitlines() if " INFO " not in line]
    if returncode != 0:
        what = f"timed out after {timeout_s:.0f} s" if returncode is None else f"exited with {returncode}"
        pytest.fail(f"{' '.join(command[2:6])} {what}; the last of its log:\n" + "\n".join(lines[-120:]))
