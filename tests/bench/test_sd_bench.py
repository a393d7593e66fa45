"""`bench sd` building blocks on a tiny model (the real run needs the trained toy target)."""

from __future__ import annotations

import math

import pytest

from tests.engine.conftest import build_tiny_model
from tests.engine.drafters import HFModelDrafter
from verl_tlt.bench.sd_bench import acceptance_length, bench_batch, measure_acceptance
from verl_tlt.engine import RolloutEngine, SamplingParams


def test_bench_batch_reports_speed_acceptance_and_checks_greedy_identity(tmp_path):
    hf_model = build_tiny_model("qwen2", tmp_path, weight_std=0.2)
    engine = RolloutEngine.from_pretrained(str(tmp_path), drafter=HFModelDrafter(hf_model))
    prompts = [[5, 6, 7], [8, 9], [10]]
    rounds = [prompts, [[11, 12], [13], [14, 15, 16]]]
    row = bench_batch(engine, rounds, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), "3_1_3")
    assert row["batch_size"] == 3 and row["rounds"] == 2 and row["greedy_identical"] is True
    assert row["acceptance_length"] == 4.0  # a perfect drafter: every draft accepted, plus the bonus token
    assert row["speedup"] > 0 and row["plain_tokens_per_s"] > 0
    accept = measure_acceptance(engine, prompts, "3_1_3", max_tokens=12)
    assert set(accept) == {"greedy", "t1"} and accept["greedy"] > 1.0
    assert math.isnan(acceptance_length([]))


def test_bench_batch_advances_progress_after_each_round(tmp_path):
    from tests.progress_probe import recording_progress

    hf_model = build_tiny_model("qwen2", tmp_path, weight_std=0.2)
    engine = RolloutEngine.from_pretrained(str(tmp_path), drafter=HFModelDrafter(hf_model))
    progress, lines = recording_progress(3, every_step=True)
    rounds = [[[5, 6]], [[7]], [[8, 9, 10]]]
    bench_batch(engine, rounds, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), "2_1_2", progress)
    assert [line.split(", ")[0] for line in lines] == ["probe: 1/3 steps", "probe: 2/3 steps", "probe: 3/3 steps"]
    assert lines[-1].endswith("2_1_2 bs=1")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["vllm", "--compile"], "unrecognized arguments: --compile"),
        (["curve", "--ks", "4"], "unrecognized arguments: --ks 4"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_options_of_the_other_backend_are_refused_not_ignored(argv, message, capsys):
    from verl_tlt.cli import main

    with pytest.raises(SystemExit) as excinfo:
        main(["bench", "sd", *argv])
    assert excinfo.value.code == 2
    assert message in capsys.readouterr().err
