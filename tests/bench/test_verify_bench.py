"""Smoke tests of `verl-tlt bench verify` on a tiny model and a tiny grid: structure of the JSON (which the
simulator's MeasuredCost reads), the device plumbing and the CPU size guard; not speed."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from verl_tlt.bench import cli, sd_overhead, verify_bench
from verl_tlt.bench.verify_bench import make_tree, tree_parents
from verl_tlt.sim.measured_cost import MeasuredCost
from verl_tlt.spec.tree import tree_attention_mask


def test_tree_shapes():
    assert tree_parents("chain", 4) == [0, 0, 1, 2, 3]
    assert tree_parents("tree", 8) == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    tree = make_tree("tree", 3, 8, 97, torch.Generator().manual_seed(0))
    assert tree.tokens.shape == tree.parents.shape == tree.depths.shape == (3, 9)
    assert tree.depths[0].tolist() == [0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert tree_attention_mask(tree.parents)[0, 5].tolist() == [True, True] + [False] * 3 + [True] + [False] * 3
    chain = make_tree("chain", 1, 4, 97, torch.Generator().manual_seed(0))
    assert chain.depths[0].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        tree_parents("star", 2)


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_verify_bench_json(tmp_path, restore_threads, caplog):
    path = tmp_path / "verify.json"
    argv = ["verify", "--json", str(path), "--model", "qwen2-tiny", "--batch-sizes", "1", "2", "--ks", "1", "2", "4"]
    # One thread: tiny ops under two OpenMP threads crawl when other jobs share the cores.
    argv += ["--context-len", "16", "--repeats", "1", "--sd-steps", "3", "--threads", "1"]
    with caplog.at_level(logging.INFO, logger="verl_tlt.progress"):
        assert cli.main(argv) == 0
    result = json.loads(path.read_text())
    # Progress counts every timed cell (k=1 included) and both SD-overhead strategies.
    lines = [record.getMessage() for record in caplog.records if record.name == "verl_tlt.progress"]
    assert lines[-1].startswith("bench verify: 26/26 measurements")
    assert result["torch_threads"] == 1
    assert {"rows", "sd_overhead_fraction_bs1", "torch_threads", "model", "params_m", "context_len"} <= set(result)
    assert result["model"] == "qwen2-tiny" and result["context_len"] == 16 and result["params_m"] > 0
    rows = result["rows"]
    assert len(rows) == 2 * 2 * 2 * 3  # dtypes x modes x batch sizes x ks
    cells = {(r["mode"], r["dtype"], r["batch_size"], r["k"]) for r in rows}
    assert cells == {
        (m, d, b, k) for m in ("chain", "tree") for d in ("float32", "bfloat16") for b in (1, 2) for k in (1, 2, 4)
    }
    for row in rows:
        assert {"mode", "dtype", "batch_size", "k", "cost_vs_k1"} <= set(row)
        assert math.isfinite(row["cost_vs_k1"]) and row["cost_vs_k1"] > 0
        if row["k"] == 1:
            assert row["cost_vs_k1"] == 1.0
    assert 0 <= result["sd_overhead_fraction_bs1"] < 1
    for entry in result["sd_overhead"]:
        assert entry["step_ms"] > 0 and entry["target_forward_ms"] > 0 and entry["tokens_per_step"] >= 1


def test_verify_bench_records_device_and_feeds_measured_cost(tmp_path, restore_threads):
    path = tmp_path / "verify.json"
    # The calibration grid's form (k = 0 a plain decode step, bf16, chain only, no SD overhead), tiny.
    argv = ["verify", "--json", str(path), "--model", "qwen2-tiny", "--device", "cpu", "--dtypes", "bfloat16"]
    argv += ["--modes", "chain", "--batch-sizes", "1", "2", "4", "--ks", "0", "1", "3", "--context-len", "16"]
    argv += ["--repeats", "1", "--sd-steps", "0", "--threads", "1"]
    assert cli.main(argv) == 0
    result = json.loads(path.read_text())
    assert result["device"] == "cpu" and result["device_name"] and result["torch_version"] == torch.__version__
    assert "commit" in result and "processor" in result
    assert result["sd_overhead"] == [] and result["sd_overhead_fraction_bs1"] is None
    assert {row["k"] for row in result["rows"]} == {0, 1, 3}
    cost = MeasuredCost.from_verify_json(path)
    assert cost.dtype == "bfloat16" and cost.mode == "chain" and cost.model == "qwen2-tiny"
    assert cost.batch_sizes == (1, 2, 4) and cost.widths == (1, 2, 4)  # width = k + 1: plain decode is measured
    plain_bs2 = next(row for row in result["rows"] if row["batch_size"] == 2 and row["k"] == 0)
    assert cost.step_seconds(2, 1) == pytest.approx(plain_bs2["forward_ms"] / 1e3)


def test_every_timed_call_waits_for_the_device(monkeypatch, restore_threads):
    """On CUDA a clock read must follow a synchronize; on CPU the same calls run, so count them here."""
    waits = {"verify": 0, "sd": 0}

    def counting(name):
        def synchronizer(device):
            def wait():
                waits[name] += 1

            return wait

        return synchronizer

    monkeypatch.setattr(verify_bench, "synchronizer", counting("verify"))
    monkeypatch.setattr(sd_overhead, "synchronizer", counting("sd"))
    torch.set_num_threads(1)
    verify_bench.run(None, "qwen2-tiny", [1, 2], [2], ["float32"], ["chain"], 16, repeats=2, sd_steps=2, sd_warmup=1)
    assert waits["verify"] == 2 * 2 * 3  # (batch 1, 2) x (k = 1 first, then 2) x (one warm-up + 2 repeats)
    # Per strategy and measured step: 2 around the step, and 2 around each wrapped target and drafter call (at least
    # one of each a step); without the wrapped calls' waits the count would be exactly 2 * 2 * 2.
    assert waits["sd"] >= 2 * 2 * (2 + 2 * 2)


def test_seven_b_on_cpu_is_refused_before_anything_is_built(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["verify", "--model", "qwen2.5-7b", "--dtypes", "bfloat16"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--model qwen2.5-7b has 7.62B parameters (15.2 GB in bfloat16)" in error
    assert "--device cuda" in error and "--allow-large-cpu" in error


def test_cli_lists_the_bench_models_and_cpu_limit():
    assert cli.VERIFY_MODELS == list(verify_bench.MODELS)
    assert cli.VERIFY_CPU_MAX_GIB << 30 == verify_bench.CPU_MAX_WEIGHT_BYTES
    assert verify_bench.cpu_size_problem("qwen2-150m", ["float32", "bfloat16"]) is None


@pytest.mark.gpu
def test_verify_bench_on_cuda(tmp_path):
    path = tmp_path / "verify_cuda.json"
    argv = ["verify", "--json", str(path), "--model", "qwen2-tiny", "--device", "cuda", "--batch-sizes", "1", "4"]
    argv += ["--ks", "0", "1", "4", "--context-len", "16", "--repeats", "2", "--sd-steps", "3"]
    assert cli.main(argv) == 0
    result = json.loads(path.read_text())
    assert result["device"] == "cuda" and result["device_name"] == torch.cuda.get_device_name()
    assert result["cuda"] == torch.version.cuda and len(result["rows"]) == 2 * 2 * 2 * 3
    assert all(row["forward_ms"] > 0 for row in result["rows"])
    assert 0 <= result["sd_overhead_fraction_bs1"] < 1 and result["sd_overhead"][0]["dtype"] == "float32"
    for dtype in ("float32", "bfloat16"):
        assert MeasuredCost.from_verify_json(path, dtype=dtype).widths == (1, 2, 5)
