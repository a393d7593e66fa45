"""Recordings of a run's drafter captures: round trip, step order, clear errors."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.drafter.capture_record import RecordedStep, load_steps, save_step
from verl_tlt.drafter.data import DrafterSample


def sample(length: int, step: int) -> DrafterSample:
    return DrafterSample(torch.arange(length), torch.randn(length, 3), torch.arange(length) >= 1, step)


def test_steps_round_trip_in_step_order(tmp_path):
    weights = {"model.embed_tokens.weight": torch.randn(5, 3)}
    save_step(tmp_path, RecordedStep(10, [sample(4, 10)], weights))
    save_step(tmp_path, RecordedStep(2, [sample(6, 2), sample(3, 2)], None))
    steps = load_steps(tmp_path)
    assert [s.step for s in steps] == [2, 10]  # numeric order, whatever the write order
    assert [s.num_tokens for s in steps[0].samples] == [6, 3] and steps[0].shared_weights is None
    assert torch.equal(steps[1].shared_weights["model.embed_tokens.weight"], weights["model.embed_tokens.weight"])
    assert not list(tmp_path.glob("*.partial"))


def test_an_empty_or_corrupt_recording_names_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="tlt.drafter.record_dir="):
        load_steps(tmp_path)
    (tmp_path / "step_00001.pt").write_bytes(b"truncated")
    with pytest.raises(ValueError, match="Cannot read the drafter recording .*step_00001.pt"):
        load_steps(tmp_path)
