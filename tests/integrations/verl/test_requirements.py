"""check_requirements: a run that asks for TLT gets it or stops at start-up, with the key, the value and the fix."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from verl_tlt.config import TLTConfig
from verl_tlt.integrations.verl.requirements import TLTNotAvailableError, check_requirements


def _verl_config(tlt: dict | None = None, rollout: str | None = "torch", use_v1=True, mode="tlt_sync") -> dict:
    """The parts of a composed verl config the check reads (None: the key is absent)."""
    config: dict = {"trainer": {"use_v1": use_v1, "v1": {"trainer_mode": mode}}, "actor_rollout_ref": {"rollout": {}}}
    if rollout is not None:
        config["actor_rollout_ref"]["rollout"]["name"] = rollout
    if tlt is not None:
        config["tlt"] = tlt
    return config


def _refusal(config) -> str:
    with pytest.raises(TLTNotAvailableError) as excinfo:
        check_requirements(config)
    return str(excinfo.value)


def test_tlt_off_passes_with_any_trainer_and_rollout():
    config = _verl_config({"enabled": False}, rollout="vllm", use_v1=False, mode="separate_async")
    assert check_requirements(config) == TLTConfig()
    assert check_requirements({}) == TLTConfig()  # no tlt block at all: stock verl


def test_tlt_on_passes_with_the_tlt_trainer_and_the_torch_rollout():
    assert check_requirements(_verl_config({"enabled": True})) == TLTConfig(enabled=True)


def test_a_bad_tlt_block_fails_with_the_config_error():
    with pytest.raises(ValueError, match=r"Unknown config key 'tlt.foo'"):
        check_requirements(_verl_config({"foo": 1}))


def test_verls_sync_trainer_is_refused_with_the_plus_tlt_on_fix():
    message = _refusal(_verl_config({"enabled": True}, mode="sync"))
    assert "trainer.v1.trainer_mode=sync selects verl's own trainer" in message
    assert "+tlt=off tlt.enabled=true" in message and "Fix: turn TLT on with +tlt=on" in message


def test_a_trainer_mode_without_a_tlt_variant_is_refused():
    message = _refusal(_verl_config({"enabled": True}, mode="separate_async"))
    assert "got trainer.v1.trainer_mode=separate_async" in message
    assert "Fix: drop the trainer.v1.trainer_mode override" in message and "tlt.enabled=false" in message


def test_the_legacy_trainer_is_refused():
    message = _refusal(_verl_config({"enabled": True}, use_v1=False))
    assert "got trainer.use_v1=false" in message and "Fix: set trainer.use_v1=true" in message


def test_a_config_without_trainer_settings_is_refused_not_guessed():
    message = _refusal({"tlt": {"enabled": True}})
    assert "trainer.use_v1=<not set>" in message


def test_tlt_on_passes_with_verls_vllm_rollout():
    assert check_requirements(_verl_config({"enabled": True}, rollout="vllm")) == TLTConfig(enabled=True)


def test_another_rollout_is_refused_with_the_fix():
    message = _refusal(_verl_config({"enabled": True}, rollout="sglang"))
    assert "got sglang" in message and "actor_rollout_ref.rollout.name=vllm" in message
    assert "tlt.enabled=false (the default)" in message


def _vllm_refusal(rollout: dict, tlt: dict | None = None) -> str:
    config = _verl_config({"enabled": True, **(tlt or {})}, rollout="vllm")
    config["actor_rollout_ref"]["rollout"].update(rollout)
    return _refusal(config)


@pytest.mark.parametrize(
    ("rollout", "expected"),
    [
        ({"data_parallel_size": 2}, "actor_rollout_ref.rollout.data_parallel_size=1"),
        ({"mtp": {"enable": True, "enable_rollout": True}}, "actor_rollout_ref.rollout.mtp.enable_rollout=false"),
        ({"checkpoint_engine": {"backend": "delta_sharded"}}, "checkpoint_engine.backend=naive"),
        ({"engine_kwargs": {"vllm": {"speculative_config": {"method": "ngram"}}}}, "remove that override"),
        ({"engine_kwargs": {"vllm": {"worker_extension_cls": "my.Ext"}}}, "remove that override"),
    ],
)
def test_what_tlt_cannot_serve_on_vllm_is_refused_with_the_fix(rollout, expected):
    message = _vllm_refusal(rollout)
    assert expected in message and "tlt.enabled=false" in message


def test_vllm_accepts_what_it_can_serve():
    config = _verl_config({"enabled": True}, rollout="vllm")
    config["actor_rollout_ref"]["rollout"].update(
        {
            "data_parallel_size": 1,
            "mtp": {"enable": True, "enable_rollout": False},
            "checkpoint_engine": {"backend": "naive"},
        }
    )
    check_requirements(config)


def test_explicit_tree_strategies_are_refused_on_vllm_with_the_chains_that_fix_it():
    message = _vllm_refusal({}, {"speculative": {"strategies": ["6_4_8", "4_1_4"]}})
    assert "vLLM drafts chains only" in message and """tlt.speculative.strategies='["6_1_6","4_1_4"]'""" in message
    check_requirements(_verl_config({"enabled": True, "speculative": {"strategies": ["6_4_8"]}}))  # torch: trees fine


def test_an_unset_rollout_name_reads_as_not_set():
    assert "got <not set>" in _refusal(_verl_config({"enabled": True}, rollout=None))
    # verl's own default is the mandatory value `???`; the check reads it as unset instead of failing on it.
    config = OmegaConf.create(_verl_config({"enabled": True}, rollout="???"))
    assert "got <not set>" in _refusal(config)


def test_a_missing_drafter_directory_is_refused_before_anything_starts(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(ValueError) as excinfo:
        check_requirements(_verl_config({"enabled": True, "drafter": {"init": missing}}))
    assert f"tlt.drafter.init='{missing}'" in str(excinfo.value)
    assert "set tlt.drafter.init=target" in str(excinfo.value)
    (tmp_path / "config.json").write_text("{}")
    check_requirements(_verl_config({"enabled": True, "drafter": {"init": str(tmp_path)}}))
    check_requirements(_verl_config({"drafter": {"init": missing}}))  # TLT off: not read


def test_requirements_module_imports_no_framework():
    code = (
        "import sys, verl_tlt.integrations.verl.requirements; "
        "bad = [m for m in ('verl', 'ray', 'torch', 'vllm') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


GROUP_DRAFTS = {"enabled": True, "speculative": {"group_drafts": True}}


def test_group_drafts_need_the_agent_loop_that_names_groups():
    message = _refusal(_verl_config(GROUP_DRAFTS))
    assert "tlt.speculative.group_drafts=true" in message
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=<not set>" in message
    assert "Fix: actor_rollout_ref.rollout.agent.default_agent_loop=slot_seeded_single_turn_agent" in message
    config = _verl_config(GROUP_DRAFTS)
    config["actor_rollout_ref"]["rollout"]["agent"] = {"default_agent_loop": "slot_seeded_single_turn_agent"}
    assert check_requirements(config).speculative.group_drafts


def test_group_drafts_are_refused_on_vllm_with_the_fix():
    message = _vllm_refusal({}, GROUP_DRAFTS)
    assert "group drafts run in verl-tlt's torch rollout only" in message
    assert "Fix: tlt.speculative.group_drafts=false, or actor_rollout_ref.rollout.name=torch" in message


def test_drafter_device_cuda_is_refused_on_the_torch_rollout_whose_replicas_hold_no_gpu():
    message = _refusal(_verl_config({"enabled": True, "drafter": {"device": "cuda"}}))
    assert "tlt.drafter.device=cuda" in message and "tlt.drafter.device=auto" in message
    assert check_requirements(_verl_config({"enabled": True, "drafter": {"device": "cpu"}})).drafter.device == "cpu"
