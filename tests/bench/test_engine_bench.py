"""`bench engine` on a tiny model: the row keys docs/benchmarks.md reports, eager and compiled."""

from __future__ import annotations

import json

import pytest

from verl_tlt.bench import engine_bench
from verl_tlt.bench.engine_bench import BenchModel


@pytest.fixture
def tiny_bench_model(monkeypatch):
    tiny = BenchModel("tiny", 32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, vocab_size=50)
    monkeypatch.setitem(engine_bench.MODELS, "tiny", tiny)
    return "tiny"


def test_engine_bench_writes_eager_and_compiled_rows(tmp_path, tiny_bench_model):
    out = tmp_path / "engine.json"
    engine_bench.run(str(out), [tiny_bench_model], [1, 3], prompt_len=4, new_tokens=6, repeats=1)
    result = json.loads(out.read_text())
    assert result["compiled"] is True and [row["batch_size"] for row in result["rows"]] == [1, 3]
    for row in result["rows"]:
        assert row["model"] == "tiny"
        for key in ("tokens_per_s", "hf_tokens_per_s", "speedup_vs_hf", "compiled_tokens_per_s", "compile_warmup_s"):
            assert row[key] > 0
        assert row["compiled_same_tokens"] is True
        ratio = row["compiled_tokens_per_s"] / row["hf_tokens_per_s"]
        assert row["compiled_speedup_vs_hf"] == pytest.approx(ratio, rel=0.01)


def test_engine_bench_can_skip_the_compiled_engine(tiny_bench_model):
    result = engine_bench.run(None, [tiny_bench_model], [2], prompt_len=4, new_tokens=4, repeats=1, compile=False)
    (row,) = result["rows"]
    assert result["compiled"] is False and "compiled_tokens_per_s" not in row and row["speedup_vs_hf"] > 0
