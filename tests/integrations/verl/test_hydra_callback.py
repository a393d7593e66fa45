"""The Hydra callback of tlt/on.yaml and tlt/off.yaml: verl's stock entry point stops when TLT is asked for in vain.

Composition only (in-process, Ray never starts); tests/test_entry_points.py runs the real entry point.
"""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from hydra.utils import instantiate
from omegaconf import DictConfig

from verl_tlt.integrations.verl.hydra_callback import TLTRequirementsCallback

CALLBACK_KEY = "verl_tlt_requirements"
TORCH = "actor_rollout_ref.rollout.name=torch"


def _stock(overrides: list[str]) -> DictConfig:
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides, return_hydra_config=True)


def _start_job(config: DictConfig) -> None:
    """What Hydra's run_job does with the config's callbacks before the task function."""
    for params in config.hydra.callbacks.values():
        instantiate(params).on_job_start(config=config, task_function=None)


@pytest.mark.parametrize("option", ["on", "off"])
def test_both_tlt_options_add_the_requirements_callback(option):
    config = _stock([f"+tlt={option}"])
    assert isinstance(instantiate(config.hydra.callbacks[CALLBACK_KEY]), TLTRequirementsCallback)


@pytest.mark.parametrize("overrides", [["+tlt=on", TORCH], ["+tlt=off"], ["+tlt=off", "trainer.use_v1=false"]])
def test_a_run_that_gets_what_it_asks_for_starts(overrides):
    _start_job(_stock(overrides))


def test_tlt_off_with_enabled_true_stops_with_the_plus_tlt_on_fix():
    with pytest.raises(SystemExit) as excinfo:
        _start_job(_stock(["+tlt=off", "tlt.enabled=true", TORCH]))
    message = str(excinfo.value.code)
    assert message.startswith("verl-tlt: TLTNotAvailableError: tlt.enabled=true")
    assert "Fix: turn TLT on with +tlt=on" in message


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.v1.trainer_mode=separate_async", "trainer.v1.trainer_mode=separate_async"),
        ("trainer.use_v1=false", "trainer.use_v1=false"),
        ("actor_rollout_ref.rollout.name=sglang", "got sglang"),
        ("tlt.drafter.init=/nonexistent/drafter", "tlt.drafter.init='/nonexistent/drafter'"),
    ],
)
def test_tlt_on_stops_on_what_cannot_run_tlt(override, named):
    with pytest.raises(SystemExit) as excinfo:
        _start_job(_stock(["+tlt=on", TORCH, override]))
    assert named in str(excinfo.value.code)
