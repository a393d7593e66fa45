"""The tlt_sync trainer's pieces that need no verl: mode selection and the runtime it holds with TLT off.

The trainer class itself (registration, pickling, disabled == verl's sync trainer) is tested with the entry
points in tests/test_entry_points.py.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_tlt.integrations.verl import trainer_mode
from verl_tlt.integrations.verl.mode_selection import TLT_TRAINER_MODE, VERL_SYNC_MODE, select_trainer_mode
from verl_tlt.integrations.verl.trainer_mode import DisabledTLT

ON_YAML = Path(trainer_mode.__file__).resolve().parents[2] / "hydra_conf" / "tlt" / "on.yaml"


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def _runtime_calls_in_trainer() -> set[str]:
    """Every `self.tlt.<method>(...)` the trainer class makes."""
    tree = ast.parse(inspect.getsource(trainer_mode))
    calls = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr == "tlt" and getattr(owner.value, "id", "") == "self":
                calls.add(node.func.attr)
    return calls


def test_disabled_runtime_offers_every_hook_the_trainer_calls():
    calls = _runtime_calls_in_trainer()
    assert {"on_sample_begin", "arm_capture", "save_checkpoint"} <= calls  # the scan finds the hooks
    assert calls <= set(_public_methods(DisabledTLT))


def test_disabled_runtime_has_the_tlt_runtimes_signatures():
    pytest.importorskip("ray")
    from verl_tlt.integrations.verl.tlt_runtime import TLTRuntime

    runtime = _public_methods(TLTRuntime)
    for name, signature in _public_methods(DisabledTLT).items():
        assert name in runtime, f"TLTRuntime has no {name}"
        assert list(signature.parameters) == list(runtime[name].parameters), name


def test_disabled_runtime_reports_no_metrics():
    assert DisabledTLT().pop_metrics() == {}


@pytest.mark.parametrize(
    ("configured", "enabled", "expected"),
    [
        (VERL_SYNC_MODE, True, TLT_TRAINER_MODE),
        (VERL_SYNC_MODE, False, VERL_SYNC_MODE),
        ("separate_async", True, "separate_async"),  # left for the requirements check to refuse
        (TLT_TRAINER_MODE, True, TLT_TRAINER_MODE),
    ],
)
def test_select_trainer_mode_turns_only_verls_sync_into_tlt_sync_when_tlt_is_on(configured, enabled, expected):
    config = OmegaConf.create({"trainer": {"v1": {"trainer_mode": configured}}})
    select_trainer_mode(config, enabled)
    assert config.trainer.v1.trainer_mode == expected


def test_tlt_on_yaml_selects_the_registered_mode():
    assert OmegaConf.load(ON_YAML).trainer.v1.trainer_mode == TLT_TRAINER_MODE
