"""State without pickle: exact round trips, nothing executed on load, and a clear error for every kind of damage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from verl_tlt.drafter.safe_state import STATE_FILE, TENSORS_FILE, StateFileError, load_state, save_state


class Planted:
    """Unpickling this opens (creates) `marker`: the stand-in for code a planted pickle would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def varied_state() -> dict:
    shared = torch.arange(12, dtype=torch.float32).view(3, 4)
    return {
        "model": {"fc.weight": torch.randn(3, 4), "norm.weight": torch.ones(4, dtype=torch.bfloat16)},
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(3, 4)}, 1: {"step": torch.tensor(3.0)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0, 1], "foreach": None, "fused": False}],
        },
        "generator": torch.Generator().manual_seed(5).get_state(),
        "rows": [(shared[0], shared[1:], torch.tensor([True, False]), 7)],  # views of one storage
        "empty": torch.zeros(0, 2, dtype=torch.long),
        "extras": {"__private": "a key that looks like a tag"},
        "counts": {2: 1, "x": 0.5},
        "nothing": None,
    }


def assert_same(a, b, where: str = "/") -> None:
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert_same(a[key], b[key], f"{where}{key}/")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}{i}/")
    else:
        assert a == b, where


def test_a_state_round_trips_with_its_types_keys_and_tensors_exactly(tmp_path):
    state = varied_state()
    save_state(tmp_path / "s", state, kind="test")
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [STATE_FILE, TENSORS_FILE]
    assert_same(state, load_state(tmp_path / "s", kind="test"))


def test_an_unstorable_value_is_refused_with_its_place_and_nothing_is_written(tmp_path):
    with pytest.raises(TypeError, match=r"cannot store a Planted at /extra/1"):
        save_state(tmp_path / "s", {"extra": [1, Planted(tmp_path / "m")]}, kind="test")
    assert list(tmp_path.iterdir()) == []


def test_a_planted_pickle_is_refused_without_being_run(tmp_path):
    save_state(tmp_path / "s", varied_state(), kind="test")
    marker = tmp_path / "payload_ran"
    torch.save({"weights": Planted(marker)}, tmp_path / "s" / TENSORS_FILE)
    with pytest.raises(StateFileError, match=rf"{TENSORS_FILE} is a pickle.*never unpickles"):
        load_state(tmp_path / "s", kind="test")
    assert not marker.exists()


def edit_document(directory: Path, edit) -> None:
    document = json.loads((directory / STATE_FILE).read_text())
    edit(document)
    (directory / STATE_FILE).write_text(json.dumps(document))


def truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - 10])


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: truncate(d / TENSORS_FILE), rf"{TENSORS_FILE} is not a readable safetensors file"),
        (lambda d: (d / TENSORS_FILE).unlink(), rf"{TENSORS_FILE} is missing"),
        (lambda d: truncate(d / STATE_FILE), rf"{STATE_FILE} is not valid JSON"),
        (lambda d: edit_document(d, lambda doc: doc.update(kind="other")), r"holds a 'other', expected a 'test'"),
        (lambda d: edit_document(d, lambda doc: doc.update(format_version=99)), r"format_version 99"),
        (
            lambda d: edit_document(d, lambda doc: doc["state"]["model"].update({"fc.weight": {"__tensor__": "nope"}})),
            r"the tensor at /model/fc.weight \('nope'\) names no stored tensor",
        ),
        (
            lambda d: edit_document(d, lambda doc: doc["state"]["model"].pop("norm.weight")),
            r"holds tensors \['model/norm.weight'\] that .* does not refer to",
        ),
        (
            lambda d: edit_document(d, lambda doc: doc["state"].update(nothing={"__tuple__": 3})),
            r"malformed __tuple__ entry at /nothing",
        ),
        (lambda d: edit_document(d, lambda doc: doc.update(tensors_id="0" * 32)), r"belongs to another save"),
    ],
    ids=[
        "truncated-tensors",
        "missing-tensors",
        "truncated-json",
        "other-kind",
        "newer-format",
        "dangling-reference",
        "unreferenced-tensor",
        "malformed-tag",
        "tensors-of-another-save",
    ],
)
def test_damage_is_a_clear_error_naming_the_file(tmp_path, damage, message):
    save_state(tmp_path / "s", varied_state(), kind="test")
    damage(tmp_path / "s")
    with pytest.raises(StateFileError, match=message) as error:
        load_state(tmp_path / "s", kind="test")
    assert str(tmp_path / "s") in str(error.value)


def test_a_directory_without_a_state_file_is_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"No {STATE_FILE} in"):
        load_state(tmp_path, kind="test")
