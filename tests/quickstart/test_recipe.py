"""The quickstart's runs: the control repeats the baseline's config exactly, and every run is traced."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_tlt.quickstart.recipe import BASELINE, CONTROL, RUNS, TRACE_FILE, run_overrides


def test_the_control_is_the_baseline_config_again_and_runs_last():
    assert RUNS[CONTROL] == RUNS[BASELINE] == ["tlt.enabled=false"]
    assert list(RUNS)[-1] == CONTROL
    common = ["a=1"]
    base = run_overrides(BASELINE, common, Path("/out/baseline"))
    control = run_overrides(CONTROL, common, Path("/out/baseline_repeat"))
    assert [o for o in base if "trace_path" not in o] == [o for o in control if "trace_path" not in o]


def test_every_run_writes_a_rollout_trace_in_its_own_folder():
    overrides = run_overrides("tlt", ["a=1"], Path("/out/tlt"))
    assert overrides[-1] == f"+actor_rollout_ref.rollout.engine_kwargs.torch.trace_path=/out/tlt/{TRACE_FILE}"
    assert overrides[:3] == ["a=1", "tlt.enabled=true", "tlt.drafter.train=true"]


def test_an_unknown_run_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"Unknown quickstart run 'fast'; choose from \['baseline', 'tlt'"):
        run_overrides("fast", [], Path("/out"))
