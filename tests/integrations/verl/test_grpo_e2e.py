"""verl GRPO end to end on CPU with the torch rollout: 2 steps of one real verl job, under a hard timeout.

verl's own entry point (`verl.trainer.main_ppo`, the plugin registering the torch rollout) with the engine compiled:
the compiled graphs must use the weights verl syncs in after every update. Two steps are what the claims need: the
second rollout runs on weights synced in after the first update. TLT's own entry point with TLT off is covered by
tests/integrations/verl/test_tlt_e2e.py (its TLT-off runs), the eager engine in verl by every other e2e run.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from verl_tlt.quickstart.recipe import toy_grpo_overrides
from verl_tlt.quickstart.verl_job import run_verl_job
from verl_tlt.toy.build import build_toy_world

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
DENSE_REWARD = str(Path(__file__).with_name("dense_reward.py"))
STEPS = 2


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_toy_world(tmp_path_factory.mktemp("toy-world"), num_train=64, num_val=8)


def test_grpo_trains_on_cpu_with_the_compiled_torch_rollout_from_verls_entry_point(world, tmp_path):
    overrides = toy_grpo_overrides(
        world, steps=STEPS, batch_size=4, group_size=2, max_response_length=48, lr=1e-3, reward_fn=DENSE_REWARD
    )
    overrides.append("actor_rollout_ref.rollout.engine_kwargs.torch.compile=true")
    result = run_verl_job(overrides, tmp_path, timeout_s=420, entry_module="verl.trainer.main_ppo")

    assert [m["step"] for m in result.metrics] == list(range(1, STEPS + 1))
    for m in result.metrics:
        assert m["actor/grad_norm"] > 0 and math.isfinite(m["actor/grad_norm"])
        assert math.isfinite(m["critic/score/mean"]) and m["critic/score/max"] > m["critic/score/min"]
        # The rollout's log-probs are the trainer's: weights were synced after every update (lr=1e-3 moves them).
        assert m["training/rollout_probs_diff_max"] < 1e-4
        assert m["response_length/mean"] > 0
    assert result.metrics[0]["actor/entropy"] != result.metrics[-1]["actor/entropy"]
