"""TLT through a real verl run on verl's vLLM rollout (vLLM's CPU build): lossless and trained.

Every job is a real `python -m verl_tlt.main_ppo +cpu=vllm` run (two vLLM replicas, the SFT toy target, greedy
REINFORCE++, three steps) under a hard timeout, in the vLLM environment (.venv-vllm). The drafter starts from the
target (tlt.drafter.init=target), as in the torch engine's e2e tests. That a dying drafter worker never stops the
run is the driver's drafter pool's doing, the same on both rollouts: the real-weights run checks it
(tests/integrations/verl/test_smollm2_e2e.py).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm")

from tests.integrations.verl.test_tlt_e2e import (  # noqa: E402
    NO_PLAIN_ARM,
    TRAINS_IN_ANY_WINDOW,
    responses_by_step,
    tlt_metrics,
)
from verl_tlt.integrations.verl.same_samples import SAME_SAMPLES_OVERRIDES  # noqa: E402
from verl_tlt.quickstart.recipe import toy_grpo_overrides  # noqa: E402
from verl_tlt.quickstart.verl_job import run_verl_job  # noqa: E402
from verl_tlt.toy.build import build_toy_world  # noqa: E402
from verl_tlt.toy.sft import ensure_toy_target  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.e2e, pytest.mark.timeout(900)]

JOB_TIMEOUT_S = 480
STEPS = 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_toy_world(tmp_path_factory.mktemp("toy-world"), num_train=128, num_val=8)


@pytest.fixture(scope="module")
def target():
    return ensure_toy_target()


def run(world, target, out_dir, *, tlt: bool, env=None):
    overrides = toy_grpo_overrides(
        world,
        steps=STEPS,
        batch_size=16,
        group_size=1,
        max_response_length=128,
        lr=1e-3,
        model_dir=target,
        replicas=2,
        rollout="vllm",
    )
    # REINFORCE++ learns from single greedy samples, so the policy moves while the rollouts stay deterministic.
    overrides += ["algorithm.adv_estimator=reinforce_plus_plus", "actor_rollout_ref.rollout.top_k=1"]
    overrides += list(SAME_SAMPLES_OVERRIDES)
    if tlt:
        # As in the torch engine's e2e tests: no plain arm below the threshold, so every step has SD to check.
        overrides += [
            "tlt.enabled=true",
            "tlt.drafter.init=target",
            f"tlt.speculative.plain_arm_min_batch={NO_PLAIN_ARM}",
        ]
    return run_verl_job(overrides, out_dir, timeout_s=JOB_TIMEOUT_S, entry_module="verl_tlt.main_ppo", env=env)


def test_greedy_rollouts_on_vllm_are_identical_with_tlt_on_and_off(world, target, tmp_path):
    # Every burst takes a step however short its window (TRAINS_IN_ANY_WINDOW): the drafter trains on any host.
    off, on = (
        run(world, target, tmp_path / name, tlt=tlt, env=env)
        for name, tlt, env in (("off", False, None), ("on", True, TRAINS_IN_ANY_WINDOW))
    )
    assert [m["step"] for m in on.metrics] == list(range(1, STEPS + 1))
    off_responses, on_responses = responses_by_step(off), responses_by_step(on)
    for step in range(1, STEPS + 1):
        assert len(on_responses[step]) == 16
        assert on_responses[step] == off_responses[step], f"step {step}: TLT changed a greedy rollout"
    assert all(m["actor/grad_norm"] > 0 for m in on.metrics)  # the policy moved between the steps
    assert not any(k.startswith("tlt/") for m in off.metrics for k in m), "TLT off must log nothing of TLT"

    for m in on.metrics:
        tlt = tlt_metrics(m)
        assert all(math.isfinite(v) for v in tlt.values()), tlt
        for key in (
            "tlt/sd/acceptance_length",
            "tlt/sd/step_share",
            "tlt/sd/token_share",
            "tlt/tail/time_to_90pct_s",
            "tlt/rollout/time_s",
            "tlt/spot/idle_replica_s",
            "tlt/capture/samples",
            "tlt/drafter/version",
        ):
            assert key in tlt, f"step {m['step']}: missing {key}"
        assert "tlt/rollout/engine_busy_s" not in tlt  # vLLM does not report it: no made-up zero
        assert tlt["tlt/sd/step_share"] > 0 and tlt["tlt/sd/acceptance_length"] >= 1.0
        # Every replica sampled the step's rollout with the same drafter, unless a replica's self-test refused the
        # new version (it then keeps the previous one, by design: the drafter here starts from the target and sits
        # near the test's 10% floor, so a refusal is a real, if rare, outcome).
        if not tlt["tlt/drafter/self_test_refused"]:
            assert tlt["tlt/drafter/rollout_version_min"] == tlt["tlt/drafter/rollout_version_max"]
    # The drafter learned on drained replicas, and each step's rollout ran the version pushed after the step before.
    assert any(tlt_metrics(m)["tlt/spot/trained_replica_s"] > 0 for m in on.metrics)
    assert tlt_metrics(on.metrics[-1])["tlt/drafter/total_steps"] >= 1
    for before, after in zip(on.metrics, on.metrics[1:], strict=False):
        ran = tlt_metrics(after)
        version = "rollout_version_max" if ran["tlt/drafter/self_test_refused"] else "rollout_version_min"
        if ran["tlt/drafter/self_test_refused"] < 2:  # one replica at most kept its previous drafter
            assert ran[f"tlt/drafter/{version}"] == tlt_metrics(before)["tlt/drafter/version"]
    assert tlt_metrics(on.metrics[-1])["tlt/drafter/version"] >= 1
    # The replicas self-tested their drafter (before each rollout after the first: the one that follows a sleep or
    # a drafter load), with probe requests that left every rollout above identical.
    tests = [tlt_metrics(m) for m in on.metrics if "tlt/drafter/self_test_runs" in m]
    assert sum(t["tlt/drafter/self_test_runs"] for t in tests) >= 1, [tlt_metrics(m) for m in on.metrics]
    assert all(0.0 <= t["tlt/drafter/self_test_accept_rate"] <= 1.0 for t in tests if t["tlt/drafter/self_test_runs"])
