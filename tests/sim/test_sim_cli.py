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
