"""The two ways to turn TLT on, and the ``tlt_sync`` trainer mode; CPU only, Ray is never started.

1. ``python -m verl_tlt.main_ppo ... tlt.enabled=true`` (wrapper config, no ``+``);
2. ``python -m verl.trainer.main_ppo ... +tlt=on`` (stock entry point, Hydra SearchPathPlugin).

Subprocess tests (marked ``slow``) pay verl's import, ~5 s each: Hydra's ``pkg://verl.trainer.config``
imports verl even for ``--cfg job``. Everything else composes in-process.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import DictConfig, OmegaConf

from verl_tlt.config import TLTConfig
from verl_tlt.integrations.verl.requirements import TLTNotAvailableError

WRAPPER_MODULE, WRAPPER_CONFIG = "verl_tlt.hydra_conf", "tlt_ppo_trainer"
STOCK_MODULE, STOCK_CONFIG = "verl.trainer.config", "ppo_trainer"
# What verl prints / Ray logs when a run gets as far as starting Ray; none of these runs may.
RAY_STARTED_MARKERS = ("ray init kwargs", "Started a local Ray instance")
SUBPROCESS_TIMEOUT_S = 120
# Runs an entry point's real Hydra main (callbacks included) with verl's run_ppo, which would start Ray, stubbed.
ENTRY_PROBE = (
    "import sys, verl.trainer.main_ppo as verl_main; "
    "verl_main.run_ppo = lambda config, task_runner_class: print('RUN_PPO', config.trainer.v1.trainer_mode); "
    "import {module} as entry; entry.main()"
)


def _compose(module: str, name: str, overrides: list[str] | None = None) -> DictConfig:
    with initialize_config_module(config_module=module, version_base=None):
        return compose(config_name=name, overrides=overrides or [])


def _runnable(overrides: list[str] | None = None) -> list[str]:
    """Overrides that let verl's own main validate the default config on CPU (no critic model to load)."""
    return [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.rollout.name=vllm",
        *(overrides or []),
    ]


def _run_module(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    run_env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    run_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=run_env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    output = proc.stdout + proc.stderr
    assert not any(marker in output for marker in RAY_STARTED_MARKERS), f"Ray was started:\n{output[-3000:]}"
    return proc


def _without_tlt(cfg: DictConfig) -> dict:
    plain = OmegaConf.to_container(cfg)
    plain.pop("tlt", None)
    plain["actor_rollout_ref"]["rollout"].pop("custom", None)
    return plain


# ---------------------------------------------------------------- imports stay light


def test_entry_and_trainer_modules_import_no_verl():
    code = (
        "import sys, verl_tlt.main_ppo, verl_tlt.integrations.verl.trainer_mode; "
        "bad = [m for m in ('verl', 'ray', 'torch', 'vllm') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---------------------------------------------------------------- wrapper entry point: composition


def test_wrapper_default_is_stock_config_plus_tlt_block():
    wrapper = _compose(WRAPPER_MODULE, WRAPPER_CONFIG)
    stock = _compose(STOCK_MODULE, STOCK_CONFIG)
    assert TLTConfig.from_dict(wrapper.tlt) == TLTConfig()
    assert OmegaConf.to_container(wrapper.actor_rollout_ref.rollout.custom, resolve=True) == {
        "tlt": TLTConfig().to_dict()
    }
    assert _without_tlt(wrapper) == OmegaConf.to_container(stock)


def test_wrapper_sets_tlt_enabled_without_plus():
    cfg = _compose(WRAPPER_MODULE, WRAPPER_CONFIG, ["tlt.enabled=true"])
    assert TLTConfig.from_dict(cfg.tlt).enabled is True
    assert cfg.actor_rollout_ref.rollout.custom.tlt.enabled is True


def test_wrapper_rollout_config_conversion_keeps_tlt_block():
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import RolloutConfig

    cfg = _compose(WRAPPER_MODULE, WRAPPER_CONFIG, ["actor_rollout_ref.rollout.name=vllm"])
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert isinstance(rollout, RolloutConfig)
    assert rollout.custom == {"tlt": TLTConfig().to_dict()}
    assert TLTConfig.from_dict(rollout.custom["tlt"]) == TLTConfig()


# ---------------------------------------------------------------- wrapper entry point: main


def test_wrapper_main_disabled_runs_verls_own_main(monkeypatch):
    import verl.trainer.main_ppo as verl_main_ppo

    from verl_tlt import main_ppo

    calls = []
    monkeypatch.setattr(
        verl_main_ppo, "run_ppo", lambda config, task_runner_class: calls.append((config, task_runner_class))
    )
    cfg = _compose(WRAPPER_MODULE, WRAPPER_CONFIG, _runnable())
    main_ppo.main(cfg)  # Hydra's passthrough: runs the task function on this config
    [(config, runner)] = calls
    assert config is cfg and runner is verl_main_ppo.TaskRunnerV1
    assert config.trainer.v1.trainer_mode == "sync"


def test_wrapper_main_enabled_switches_sync_to_tlt_sync(monkeypatch):
    import verl.trainer.main_ppo as verl_main_ppo

    from verl_tlt import main_ppo

    calls = []
    monkeypatch.setattr(verl_main_ppo, "run_ppo", lambda config, task_runner_class: calls.append(config))
    overrides = _runnable(["tlt.enabled=true", "actor_rollout_ref.rollout.name=torch"])
    main_ppo.main(_compose(WRAPPER_MODULE, WRAPPER_CONFIG, overrides))
    assert calls[0].trainer.v1.trainer_mode == "tlt_sync"


@pytest.mark.parametrize(
    ("override", "fix"),
    [
        ("trainer.v1.trainer_mode=separate_async", "Fix: drop the trainer.v1.trainer_mode override"),
        ("trainer.use_v1=false", "Fix: set trainer.use_v1=true"),
    ],
)
def test_wrapper_refuses_trainers_without_a_tlt_mode_before_verl_runs(monkeypatch, override, fix):
    import verl.trainer.main_ppo as verl_main_ppo

    from verl_tlt import main_ppo

    calls = []
    monkeypatch.setattr(verl_main_ppo, "run_ppo", lambda config, task_runner_class: calls.append(config))
    enabled = _runnable(["tlt.enabled=true", "actor_rollout_ref.rollout.name=torch", override])
    with pytest.raises(TLTNotAvailableError, match=fix):
        main_ppo.main(_compose(WRAPPER_MODULE, WRAPPER_CONFIG, enabled))
    assert calls == []
    main_ppo.main(_compose(WRAPPER_MODULE, WRAPPER_CONFIG, _runnable([override])))  # TLT off: any stock trainer
    assert len(calls) == 1


@pytest.mark.slow
def test_wrapper_cli_unknown_key_fails_with_clear_message_before_ray(tmp_path):
    proc = _run_module(["-m", "verl_tlt.main_ppo", "+tlt.foo=1"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "Unknown config key 'tlt.foo' (value 1)" in proc.stderr
    assert "Valid keys under 'tlt': enabled" in proc.stderr


@pytest.mark.slow
def test_wrapper_cli_enabled_without_a_tlt_rollout_fails_before_ray(tmp_path):
    proc = _run_module(["-m", "verl_tlt.main_ppo", "tlt.enabled=true"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "TLTNotAvailableError" in proc.stderr
    assert "tlt.enabled=true runs on actor_rollout_ref.rollout.name=vllm or torch" in proc.stderr
    assert "got <not set>" in proc.stderr and "Fix: set actor_rollout_ref.rollout.name=vllm" in proc.stderr


# ---------------------------------------------------------------- stock entry point + SearchPathPlugin


def test_searchpath_plugin_is_discovered():
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    names = [p.__name__ for p in Plugins.instance().discover(SearchPathPlugin)]
    assert "VerlTLTSearchPathPlugin" in names


@pytest.mark.slow
def test_stock_main_composes_tlt_on_via_plugin(tmp_path):
    """``--cfg job`` makes Hydra print the composed config and return before verl's main body runs."""
    proc = _run_module(["-m", "verl.trainer.main_ppo", "+tlt=on", "--cfg", "job"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = OmegaConf.create(proc.stdout)
    assert TLTConfig.from_dict(cfg.tlt) == TLTConfig(enabled=True)
    assert cfg.actor_rollout_ref.rollout.custom.tlt.enabled is True
    assert cfg.trainer.v1.trainer_mode == "tlt_sync"
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "overrides", "mode"),
    [
        ("verl.trainer.main_ppo", ["+tlt=on", "actor_rollout_ref.rollout.name=torch"], "tlt_sync"),
        ("verl.trainer.main_ppo", ["+tlt=off"], "sync"),
        ("verl_tlt.main_ppo", ["tlt.enabled=true", "actor_rollout_ref.rollout.name=torch"], "tlt_sync"),
        ("verl_tlt.main_ppo", [], "sync"),
    ],
    ids=["stock-tlt-on", "stock-tlt-off", "wrapper-enabled", "wrapper-disabled"],
)
def test_entry_points_reach_verl_with_the_trainer_asked_for(tmp_path, module, overrides, mode):
    proc = _run_module(["-c", ENTRY_PROBE.format(module=module), *_runnable(overrides)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"RUN_PPO {mode}"


@pytest.mark.slow
def test_stock_tlt_off_with_enabled_true_stops_before_ray_with_the_fix(tmp_path):
    """``+tlt=off`` keeps verl's own trainer: asking it for TLT must not run stock verl silently."""
    overrides = _runnable(["+tlt=off", "tlt.enabled=true", "actor_rollout_ref.rollout.name=torch"])
    proc = _run_module(["-c", ENTRY_PROBE.format(module="verl.trainer.main_ppo"), *overrides], cwd=tmp_path)
    assert proc.returncode != 0
    assert "RUN_PPO" not in proc.stdout
    assert "verl-tlt: TLTNotAvailableError: tlt.enabled=true, but trainer.v1.trainer_mode=sync" in proc.stderr
    assert "Fix: turn TLT on with +tlt=on" in proc.stderr


def test_stock_tlt_off_composes_to_the_wrapper_default():
    stock_off = _compose(STOCK_MODULE, STOCK_CONFIG, ["+tlt=off"])
    assert OmegaConf.to_container(stock_off) == OmegaConf.to_container(_compose(WRAPPER_MODULE, WRAPPER_CONFIG))


def test_stock_tlt_on_keys_need_no_plus_and_survive_rollout_conversion():
    from verl.utils.config import omega_conf_to_dataclass

    cfg = _compose(STOCK_MODULE, STOCK_CONFIG, ["+tlt=on", "tlt.enabled=false", "actor_rollout_ref.rollout.name=vllm"])
    assert TLTConfig.from_dict(cfg.tlt) == TLTConfig()
    assert omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout).custom == {"tlt": TLTConfig().to_dict()}


# ---------------------------------------------------------------- tlt_sync trainer mode


@pytest.fixture
def trainer_cls():
    from verl_tlt.integrations.verl.trainer_mode import get_trainer_class, register_trainer_mode

    register_trainer_mode()
    return get_trainer_class()


def test_register_trainer_mode_is_idempotent(trainer_cls):
    from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls

    from verl_tlt.integrations.verl.trainer_mode import register_trainer_mode

    register_trainer_mode()
    register_trainer_mode()
    assert get_trainer_cls("tlt_sync") is trainer_cls
    assert issubclass(trainer_cls, PPOTrainerSync)
    assert get_trainer_cls("sync") is PPOTrainerSync


def test_register_trainer_mode_refuses_a_foreign_tlt_sync(trainer_cls, monkeypatch):
    from verl.trainer.ppo.v1 import PPOTrainerSync
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from verl_tlt.integrations.verl.trainer_mode import register_trainer_mode

    monkeypatch.setitem(TRAINER_REGISTRY, "tlt_sync", PPOTrainerSync)
    with pytest.raises(RuntimeError, match="already registered to .*PPOTrainerSync"):
        register_trainer_mode()


def test_trainer_class_pickles_by_reference(trainer_cls):
    from verl_tlt.integrations.verl import trainer_mode

    assert trainer_mode.TLTTrainerSync is trainer_cls
    assert pickle.loads(pickle.dumps(trainer_cls)) is trainer_cls


def test_trainer_checks_tlt_before_building_anything(trainer_cls):
    # A config with nothing but the tlt block: PPOTrainer.__init__ would fail on it, so reaching
    # these errors proves the check runs first.
    with pytest.raises(TLTNotAvailableError):
        trainer_cls(OmegaConf.create({"tlt": {"enabled": True}}))
    with pytest.raises(ValueError, match="'tlt.foo'"):
        trainer_cls(OmegaConf.create({"tlt": {"foo": 1}}))


def test_trainer_disabled_behaves_as_verl_sync(trainer_cls):
    import ray
    from verl.trainer.ppo.v1 import PPOTrainerSync

    from verl_tlt.integrations.verl.trainer_mode import DisabledTLT

    cfg = _compose(WRAPPER_MODULE, WRAPPER_CONFIG, ["trainer.v1.trainer_mode=tlt_sync"])
    stock = PPOTrainerSync(_compose(STOCK_MODULE, STOCK_CONFIG))
    tlt = trainer_cls(cfg)
    assert tlt.tlt_config == TLTConfig()
    assert isinstance(tlt.tlt, DisabledTLT)  # every hook a no-op: verl's code paths only
    # verl branches on trainer_mode == "sync" (replay buffer, refill, TQ checkpoints): must stay sync.
    assert tlt.trainer_mode == stock.trainer_mode == "sync"
    assert type(tlt.replay_buffer) is type(stock.replay_buffer)
    assert tlt.parameter_sync_step == stock.parameter_sync_step
    assert cfg.trainer.v1.trainer_mode == "tlt_sync"
    assert not ray.is_initialized()


def test_trainer_without_tlt_block_uses_defaults(trainer_cls):
    tlt = trainer_cls(_compose(STOCK_MODULE, STOCK_CONFIG, ["trainer.v1.trainer_mode=tlt_sync"]))
    assert tlt.tlt_config == TLTConfig()


@pytest.mark.slow
def test_register_trainer_mode_works_during_verl_import(tmp_path):
    """The verl.plugins entry point calls register_trainer_mode() while ``import verl`` is running."""
    (tmp_path / "tlt_register_probe.py").write_text(
        textwrap.dedent("""
        from verl_tlt.integrations.verl.trainer_mode import register_trainer_mode
        register_trainer_mode()
    """)
    )
    code = "import verl; from verl.trainer.ppo.v1 import get_trainer_cls; print(get_trainer_cls('tlt_sync').__name__)"
    proc = _run_module(
        ["-c", code], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "VERL_USE_EXTERNAL_MODULES": "tlt_register_probe"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "TLTTrainerSync"
