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


@pytest.mark.slow
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


def test_time_call_reports_progress_between_timed_calls_never_inside_one(monkeypatch):
    events = []

    class Beats:
        def heartbeat(self):
            events.append("beat")

    def clock():
        events.append("clock")
        return float(len(events))

    monkeypatch.setattr(engine_bench.time, "perf_counter", clock)
    engine_bench.time_call(lambda: events.append("call"), repeats=2, progress=Beats())
    # warm-up, then per repeat: a line if due, and the call between its two clock readings
    assert events == ["call", "beat", "clock", "call", "clock", "beat", "clock", "call", "clock"]


def test_engine_bench_reports_each_cell(tiny_bench_model, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="verl_tlt.progress"):
        engine_bench.run(None, [tiny_bench_model], [1, 2], prompt_len=4, new_tokens=2, repeats=1, compile=False)
    lines = [record.getMessage() for record in caplog.records if record.name == "verl_tlt.progress"]
    assert (
        lines
        and lines[-1].startswith("bench engine: 2/2 model x batch size x dtype cells")
        and "tiny bs=2" in lines[-1]
    )


def test_engine_bench_names_the_host_its_kernels_and_the_bandwidth_roofline(tiny_bench_model):
    result = engine_bench.run(
        None,
        [tiny_bench_model],
        [1],
        prompt_len=4,
        new_tokens=4,
        repeats=1,
        compile=False,
        dtypes=["float32", "bfloat16"],
    )
    assert result["host"]["processor"] and result["memory_bandwidth_bytes_per_s"] > 0
    assert [row["dtype"] for row in result["rows"]] == ["float32", "bfloat16"]
    for row in result["rows"]:
        assert row["kernels"]["host"].startswith(result["host"]["processor"])
        assert row["roofline_tokens_per_s"] == pytest.approx(
            result["memory_bandwidth_bytes_per_s"] / row["weight_bytes"], rel=0.01
        )
        assert row["hf_of_roofline"] == pytest.approx(row["hf_tokens_per_s"] / row["roofline_tokens_per_s"], abs=6e-4)


def test_the_bench_takes_the_random_shapes_and_the_real_models_by_name(tmp_path, monkeypatch):
    assert {"toy-1m", "qwen2-50m", "smollm2-135m"} <= set(engine_bench.known_models())
    assert (engine_bench.model_folder("toy-1m", tmp_path) / "config.json").is_file()
    prepared = []
    monkeypatch.setattr("verl_tlt.models.prepare.ensure_model", lambda name: prepared.append(name) or tmp_path)
    assert engine_bench.model_folder("smollm2-135m", tmp_path) == tmp_path and prepared == ["smollm2-135m"]
