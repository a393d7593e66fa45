"""Smoke test of `verl-tlt bench verify` on a tiny model and a tiny grid: structure of the JSON, not speed."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from verl_tlt.bench import cli
from verl_tlt.bench.verify_bench import make_tree, tree_parents
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
