"""Quickstart stages built apart: what a stage held stays in its child process, never in the quickstart's."""

from __future__ import annotations

import logging
from pathlib import Path

import psutil

from verl_tlt.quickstart import runner
from verl_tlt.quickstart.apart import GIB, own_memory, run_apart
from verl_tlt.quickstart.recipe import GRPOSettings, QuickstartInputs, settings_for
from verl_tlt.quickstart.report import quickstart_memory_line

HELD_GIB = 1.0
_held: list[bytearray] = []  # what a builder leaves resident after it returns (in the process that ran it)


def hold_memory(gib: float) -> float:
    """Touch `gib` of memory and keep it, as a model build that returns leaves its arenas behind; this process's RSS."""
    block = bytearray(int(gib * GIB))
    block[::4096] = b"\x01" * len(range(0, len(block), 4096))  # every page resident, not just reserved
    _held.append(block)
    return psutil.Process().memory_info().rss / GIB


def hold_memory_and_say_how_it_logs(gib: float) -> tuple[float, str]:
    formatter = next(h.formatter for h in logging.getLogger().handlers if h.formatter is not None)
    return hold_memory(gib), formatter._style._fmt


def test_a_stage_apart_logs_as_the_quickstart_does_and_what_it_holds_stays_in_its_child(monkeypatch):
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s [the caller's format] %(message)s"))
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])  # as the CLI's logging set-up leaves it
    before = psutil.Process().memory_info().rss / GIB
    child_rss, child_format = run_apart(hold_memory_and_say_how_it_logs, HELD_GIB)
    after = psutil.Process().memory_info().rss / GIB
    assert child_format == "%(asctime)s [the caller's format] %(message)s"  # its progress lines look like ours
    assert child_rss >= HELD_GIB  # the child really held it
    assert after - before < 0.2 * HELD_GIB  # and none of it is here
    assert not _held


def fake_prepare(
    model: str, cache: Path, data_dir: Path, settings: GRPOSettings, family: str, warm_drafter: bool = True
) -> tuple[QuickstartInputs, dict[str, float]]:
    """Stands in for building the toy or a real model: holds memory, as those builds do, and returns paths."""
    hold_memory(HELD_GIB)
    inputs = QuickstartInputs(
        model=model,
        train_files=cache / "t.parquet",
        val_files=cache / "v.parquet",
        actor=cache / "actor",
        drafter=cache / "drafter",
        reward_fn="r.py",
        reward_name="compute_score",
        max_prompt_length=16,
        tlt_overrides=(),
    )
    return inputs, {"drafter": 12.5}


def test_the_first_verl_run_starts_with_the_quickstart_holding_none_of_what_building_its_inputs_held(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(runner, "prepare_inputs", fake_prepare)
    started = {}

    def run_one(name, common, run_dir, **kwargs):
        started.setdefault(name, own_memory()["rss_gib"])
        return runner.RunResult(rows=[], responses={}, decode={}, wall_s=1.0)

    monkeypatch.setattr(runner, "run_one", run_one)
    before = own_memory()["rss_gib"]
    summary = runner.run_comparison(
        tmp_path, tmp_path / "out", runs=["baseline"], settings=settings_for("toy"), timeout_s=60
    )
    at_start = summary["quickstart_memory"]["at_first_run_start"]["rss_gib"]
    assert at_start - before < 0.2 * HELD_GIB and started["baseline"] - before < 0.2 * HELD_GIB
    assert summary["stage_s"]["drafter"] == 12.5  # the child's stage timings come back
    assert "resident as the first run started" in quickstart_memory_line(summary["quickstart_memory"])
