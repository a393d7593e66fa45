"""Recordings of a run's drafter captures: exact round trip, step order, nothing unpickled, clear errors."""

from __future__ import annotations

import json

import pytest
import torch

from verl_tlt.drafter.capture_record import RecordedStep, load_steps, save_step
from verl_tlt.drafter.data import DrafterSample
from verl_tlt.drafter.safe_state import STATE_FILE, TENSORS_FILE


def sample(length: int, step: int) -> DrafterSample:
    return DrafterSample(torch.arange(length), torch.randn(length, 3), torch.arange(length) >= 1, step)


def test_steps_round_trip_exactly_in_step_order(tmp_path):
    weights = {"model.embed_tokens.weight": torch.randn(5, 3)}
    recorded = [sample(6, 2), sample(3, 2)]
    save_step(tmp_path, RecordedStep(10, [sample(4, 10)], weights))
    save_step(tmp_path, RecordedStep(2, recorded, None))
    steps = load_steps(tmp_path)
    assert [s.step for s in steps] == [2, 10]  # numeric order, whatever the write order
    assert steps[0].shared_weights is None
    for got, want in zip(steps[0].samples, recorded, strict=True):
        assert got.step == want.step
        for field in ("token_ids", "hidden_states", "response_mask"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field
            assert getattr(got, field).dtype == getattr(want, field).dtype, field
    assert torch.equal(steps[1].shared_weights["model.embed_tokens.weight"], weights["model.embed_tokens.weight"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00002", "step_00010"]  # nothing half-written left


def test_an_empty_directory_names_the_setting_that_records(tmp_path):
    with pytest.raises(FileNotFoundError, match="tlt.drafter.record_dir="):
        load_steps(tmp_path)


def test_a_pickled_recording_of_an_earlier_version_is_named_and_not_read(tmp_path):
    torch.save({"step": 1, "samples": [], "shared_weights": None}, tmp_path / "step_00001.pt")
    with pytest.raises(FileNotFoundError, match=r"1 step_NNNNN.pt files .* pickle format"):
        load_steps(tmp_path)


def test_a_truncated_recording_names_its_file(tmp_path):
    path = save_step(tmp_path, RecordedStep(1, [sample(4, 1)], None))
    data = (path / TENSORS_FILE).read_bytes()
    (path / TENSORS_FILE).write_bytes(data[:-8])
    with pytest.raises(ValueError, match=rf"Cannot read the drafter recording .*step_00001: .*{TENSORS_FILE}"):
        load_steps(tmp_path)


def test_an_edited_recording_names_the_entry(tmp_path):
    path = save_step(tmp_path, RecordedStep(1, [sample(4, 1)], None))
    document = json.loads((path / STATE_FILE).read_text())
    document["state"]["samples"][0]["__tuple__"][3] = "one"
    (path / STATE_FILE).write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"step_00001: samples/0/step must be an integer, found 'one'"):
        load_steps(tmp_path)
