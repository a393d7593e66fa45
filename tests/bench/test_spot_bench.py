"""`verl-tlt bench spot` on the CPU at the toy shape: the spot-training cycle runs with the worker's own code and
reports every number the GPU check needs (the numbers themselves come from the GPU run, docs/gpu.md)."""

from __future__ import annotations

import json

import pytest

from verl_tlt.cli import main


def test_the_spot_bench_reports_the_cycle_score_precision_and_graph_part(tmp_path):
    out = tmp_path / "spot.json"
    argv = ["bench", "spot", "--shape", "toy", "--tokens", "512", "--eval-tokens", "1024", "--depths", "1", "2"]
    assert main([*argv, "--rounds", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] == "spot" and result["device"] == "cpu" and result["shape"] == "toy"
    assert [row["train_depth"] for row in result["rows"]] == [1, 2]
    for row in result["rows"]:
        assert row["tokens_per_s"] > 0 and 0 < row["tokens_per_step"] <= 512
        assert row["tensors_left_on_device"] == 0 and row["stop_latency_s"] >= row["stop_offload_s"] >= 0
        assert row["autocast"] == "fp32"  # a CPU trains in fp32
    assert result["eval_tokens"] == 1024 and result["eval_s"] > 0 and result["eval_online_num_pairs"] > 0
    # bf16 autocast (emulated on this CPU) computes the same loss to bf16 precision.
    assert 0 <= result["loss_bf16_rel_diff"] < 0.05 and result["loss_fp32"] > 0
    assert result["graph_reload"] == "skipped: CUDA graphs need CUDA"


def test_the_spot_bench_refuses_cuda_without_a_gpu(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        main(["bench", "spot", "--device", "cuda"])
    assert "--device cuda: no CUDA device here" in capsys.readouterr().err


@pytest.mark.gpu
def test_on_a_gpu_nothing_stays_on_the_device_and_the_graph_sees_in_place_loads(tmp_path):
    out = tmp_path / "spot.json"
    argv = ["bench", "spot", "--device", "cuda", "--tokens", "1024", "--eval-tokens", "2048", "--rounds", "1"]
    assert main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert all(row["tensors_left_on_device"] == 0 for row in result["rows"])
    assert result["graph_replay_equals_eager_after_in_place_copy"] is True
    assert result["graph_sees_swapped_tensors"] is False  # the control: a swapped tensor is not what the graph reads
