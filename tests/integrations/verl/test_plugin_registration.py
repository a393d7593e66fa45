"""The verl.plugins entry point registers everything, seen from a fresh interpreter, and stays cheap."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
import verl
heavy_before = sorted(
    m for m in ("verl.workers.rollout.base", "verl.trainer.ppo.v1", "verl.experimental.agent_loop", "vllm")
    if m in sys.modules
)
from verl.plugin.platform import PlatformRegistry, get_platform
from verl.workers.rollout.base import get_rollout_class
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl_tlt.integrations.verl.plugin import REGISTERED
print(json.dumps({
    "heavy_before": heavy_before,
    "platform": get_platform().device_name,
    "adapter": get_rollout_class("torch").__name__,
    "replica": RolloutReplicaRegistry.get("torch").__name__,
    "trainer": get_trainer_cls("tlt_sync").__name__,
    "registered": REGISTERED,
    "agent_loop": _agent_loop_registry.get("slot_seeded_single_turn_agent"),
}))
"""


def probe(extra_env: dict[str, str] | None = None) -> dict:
    import os

    env = {**os.environ, **(extra_env or {})}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_plugin_registers_platform_rollout_and_trainer_mode_in_a_fresh_process():
    seen = probe()
    assert seen["platform"] == "cpu"  # auto-detected: this machine has no accelerator
    assert seen["adapter"] == "TorchServerAdapter"
    assert seen["replica"] == "TorchReplica"
    assert seen["trainer"] == "TLTTrainerSync"
    assert set(seen["registered"]) == {
        "platform:cpu",
        "rollout adapter:torch",
        "rollout replica:torch",
        "trainer mode:tlt_sync",
        "agent loop:slot_seeded_single_turn_agent",
    }
    assert seen["agent_loop"] == {
        "_target_": "verl_tlt.integrations.verl.slot_seeded_agent_loop.SlotSeededSingleTurnAgentLoop"
    }


@pytest.mark.slow
def test_plugin_import_does_not_pull_in_rollout_or_trainer_modules():
    assert probe()["heavy_before"] == []


@pytest.mark.slow
def test_platform_can_be_forced_by_env():
    assert probe({"VERL_PLATFORM": "cpu"})["platform"] == "cpu"
