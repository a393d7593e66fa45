"""`verl-tlt simulate replay` on a synthetic rollout record."""

from __future__ import annotations

import json

import pytest

from tests.sim.test_calibration import record, write
from verl_tlt.sim.cli import main


def test_replay_prints_and_writes_predicted_beside_measured(tmp_path, capsys):
    costs = {"2": {"plain": [4, 2.0, 2]}, "1": {"plain": [2, 2.0, 2]}}
    path = write(tmp_path, [record(0, 0, 100.0, [100.0, 100.0], [0, 1], [3, 5], [102.5, 104.5], costs, busy=4.5)])
    assert main(["replay", str(path), "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "1 rollouts, measured 4.50 s, predicted 4.50 s (+0.0%)" in out
    saved = json.loads((tmp_path / "out.json").read_text())[str(path)]
    assert saved["measured_s"] == [4.5] and saved["predicted_s"] == pytest.approx([4.5])


def test_replay_names_a_missing_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["replay", str(tmp_path / "nope.jsonl")])
    assert "no such rollout record file" in capsys.readouterr().err


def scenario_file(tmp_path, **changes):
    import yaml

    from tests.sim.test_scenario import minimal

    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(minimal(**changes)))
    return path


def test_run_prints_every_run_and_writes_json_and_a_plot(tmp_path, capsys):
    path = scenario_file(tmp_path, tlt={"strategies": ["2_1_2"]}, runs=["baseline", "fixed"])
    out_json, out_png = tmp_path / "out.json", tmp_path / "gantt.png"
    assert main(["run", "--config", str(path), "--json", str(out_json), "--plot", str(out_png)]) == 0
    printed = capsys.readouterr().out
    assert "baseline" in printed and "fixed" in printed and "long tail: response p50 3" in printed
    saved = json.loads(out_json.read_text())
    assert saved["runs"]["baseline"]["e2e_speedup"] == 1.0 and len(saved["runs"]["fixed"]["steps"]) == 2
    assert out_png.stat().st_size > 10_000


def test_run_overrides_are_read_as_yaml_values(tmp_path, capsys):
    path = scenario_file(tmp_path)
    assert main(["run", "--config", str(path), "--set", "steps=3", "decode.fixed_s=2e-1", "runs=[baseline]"]) == 0
    assert "3 RL steps" in capsys.readouterr().out


def test_run_refuses_an_unknown_key_and_names_it(tmp_path, capsys):
    path = scenario_file(tmp_path)
    with pytest.raises(SystemExit):
        main(["run", "--config", str(path), "--set", "cluster.gpus=4"])
    assert "cluster: unknown key(s) gpus" in capsys.readouterr().err


def test_calibrate_writes_a_scenario_that_run_accepts(tmp_path, capsys):
    costs = {"2": {"plain": [40, 0.5, 20]}, "1": {"plain": [20, 0.2, 20], "2_1_2": [20, 0.5, 10]}}
    baseline = write(tmp_path, [record(0, 0, 0.0, [0.0, 0.0], [0, 1], [20, 40], [1.0, 2.0], costs, busy=1.0)])
    out = tmp_path / "fitted"
    assert (
        main(
            [
                "calibrate",
                "--baseline",
                str(baseline),
                "--speculative",
                str(baseline),
                "--other-s",
                "2.5",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert (tmp_path / "fitted.yaml").is_file() and json.loads((tmp_path / "fitted-lengths.json").read_text()) == [
        [20, 40]
    ]
    assert main(["run", "--config", str(tmp_path / "fitted.yaml")]) == 0
    assert "plain decode step" in capsys.readouterr().out


def test_calibrate_needs_the_non_rollout_seconds(tmp_path, capsys):
    costs = {"1": {"plain": [20, 0.2, 20]}}
    baseline = write(tmp_path, [record(0, 0, 0.0, [0.0], [0], [20], [1.0], costs, busy=1.0)])
    with pytest.raises(SystemExit):
        main(["calibrate", "--baseline", str(baseline), "--speculative", str(baseline), "--out", str(tmp_path / "x")])
    assert "--other-s" in capsys.readouterr().err


def test_presets_lists_each_with_its_description(capsys):
    assert main(["presets"]) == 0
    assert "qwen2.5-7b-h100-1node: Qwen2.5-7B GRPO" in capsys.readouterr().out
