"""TLT through a real verl run on CPU with the toy target: lossless with greedy rollouts and group drafts through
validation, measured, and resumable.

Every job is a real `python -m verl_tlt.main_ppo` run (two rollout replicas, the SFT toy target, a few steps)
under a hard timeout. The drafter starts from the target (tlt.drafter.init=target), so nothing but the toy
target needs to be built. Sampled rollouts, a dying drafter worker and the drafter's self-test are checked on real
weights, in `test_smollm2_e2e.py`.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest

from verl_tlt.drafter.safe_state import STATE_FILE, TENSORS_FILE
from verl_tlt.drafter.worker import FAULT_ENV
from verl_tlt.integrations.verl.same_samples import SAME_SAMPLES_OVERRIDES
from verl_tlt.quickstart.recipe import toy_grpo_overrides
from verl_tlt.quickstart.verl_job import read_rollouts, run_verl_job
from verl_tlt.toy.build import build_toy_world
from verl_tlt.toy.sft import ensure_toy_target

# Every burst takes one optimizer step before it heeds the rollout's end (drafter/worker.py's FAULT_ENV), so whether
# the drafter trained in three steps does not depend on how long the toy's tail lasted on this host.
TRAINS_IN_ANY_WINDOW = {FAULT_ENV: "min_burst_steps=1"}

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ENTRY = "verl_tlt.main_ppo"
JOB_TIMEOUT_S = 420
NO_PLAIN_ARM = 1000  # above any threshold: every bucket's arms are SD strategies only


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_toy_world(tmp_path_factory.mktemp("toy-world"), num_train=128, num_val=8)


@pytest.fixture(scope="module")
def target():
    return ensure_toy_target()


def overrides(
    world,
    target,
    *,
    steps: int,
    greedy: bool,
    tlt: bool,
    extra: list[str] = (),
    lr: float = 1e-3,
    group_size: int = 1,
    reward_fn: str | None = None,
) -> list[str]:
    """target None: the world's untrained model."""
    result = toy_grpo_overrides(
        world,
        steps=steps,
        batch_size=16,
        group_size=group_size,
        max_response_length=128,
        lr=lr,
        model_dir=target,
        replicas=2,
        reward_fn=reward_fn,
    )
    result += [
        # REINFORCE++ learns from single greedy samples (GRPO's group baseline would zero them), so the policy
        # really moves between steps while the rollouts stay deterministic.
        "algorithm.adv_estimator=reinforce_plus_plus",
    ]
    if greedy:
        result.append("actor_rollout_ref.rollout.top_k=1")
    if tlt:
        # No plain arm below the threshold: the drafter from the target rarely pays, and a policy that learned so
        # within a step may skip speculation for a whole short rollout (no probe landed), leaving no SD to check.
        result += ["tlt.enabled=true", "tlt.drafter.init=target", f"tlt.speculative.plain_arm_min_batch={NO_PLAIN_ARM}"]
    return result + list(extra)


def responses_by_step(result) -> dict[int, list[tuple[str, str]]]:
    return {
        m["step"]: sorted((r["input"], r["output"]) for r in read_rollouts(result.rollout_dump_dir, m["step"]))
        for m in result.metrics
    }


def run(
    world,
    target,
    out_dir,
    *,
    steps: int = 3,
    greedy: bool,
    tlt: bool,
    extra: list[str] = (),
    env=None,
    lr=1e-3,
    group_size: int = 1,
    reward_fn: str | None = None,
):
    """One verl job (see `overrides`) under the hard timeout."""
    settings = dict(steps=steps, greedy=greedy, tlt=tlt, extra=extra, lr=lr, group_size=group_size, reward_fn=reward_fn)
    return run_verl_job(
        overrides(world, target, **settings),
        out_dir,
        timeout_s=JOB_TIMEOUT_S,
        entry_module=ENTRY,
        env=env,
    )


def tlt_metrics(metrics: dict) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("tlt/")}


GREEDY_STEPS = 3
RESUMED_FROM = 2  # the TLT run's checkpoint that the resume test continues from


@pytest.fixture(scope="module")
def greedy_runs(world, target, tmp_path_factory):
    """The greedy pair of runs, TLT off and on (3 steps each); the TLT run also checkpoints at step 2, which the
    resume test continues from instead of running a job of its own to get there."""
    # Validation after step 2 (and the last step): verl validates without sleeping the replicas.
    # Two samples per prompt, and group drafts on with TLT: greedy siblings answer alike, so the suffix drafts from a
    # sibling are long, and they must change nothing either.
    root = tmp_path_factory.mktemp("greedy")
    validate = ["trainer.test_freq=2", *SAME_SAMPLES_OVERRIDES]
    trace = root / "on.jsonl"
    tlt_extra = [
        "tlt.speculative.group_drafts=true",
        f"+actor_rollout_ref.rollout.engine_kwargs.torch.trace_path={trace}",
        f"trainer.save_freq={RESUMED_FROM}",
    ]
    runs = {
        name: run(
            world,
            target,
            root / name,
            steps=GREEDY_STEPS,
            greedy=True,
            tlt=tlt,
            group_size=2,
            extra=validate + extra,
            env=env,
        )
        for name, tlt, extra, env in (("off", False, [], None), ("on", True, tlt_extra, TRAINS_IN_ANY_WINDOW))
    }
    return root, runs, validate + tlt_extra


def test_greedy_rollouts_are_identical_with_tlt_on_and_off(greedy_runs):
    root, runs, _ = greedy_runs
    off, on, trace = runs["off"], runs["on"], root / "on.jsonl"
    assert [m["step"] for m in on.metrics] == [1, 2, 3]
    off_responses, on_responses = responses_by_step(off), responses_by_step(on)
    for step in (1, 2, 3):
        assert len(on_responses[step]) == 32
        assert on_responses[step] == off_responses[step], f"step {step}: TLT changed a greedy rollout"
    # The policy moved (so identical rollouts at steps 2-3 mean TLT followed the updated weights exactly).
    assert all(m["actor/grad_norm"] > 0 for m in on.metrics)
    assert on.metrics[0]["actor/entropy"] != on.metrics[-1]["actor/entropy"]
    assert not any(k.startswith("tlt/") for m in off.metrics for k in m), "TLT off must log nothing of TLT"

    for m in on.metrics:
        tlt = tlt_metrics(m)
        assert all(math.isfinite(v) for v in tlt.values()), tlt
        for key in (
            "tlt/sd/acceptance_length",
            "tlt/sd/step_share",
            "tlt/tail/time_to_90pct_s",
            "tlt/tail/response_len_p90",
            "tlt/rollout/time_s",
            "tlt/rollout/engine_busy_s",
            "tlt/rollout/last_submit_s",
            "tlt/tail/extension_s",
            "tlt/spot/idle_replica_s",
            "tlt/spot/idle_share_used",
            "tlt/spot/stops_in_background",
            "tlt/capture/samples",
            "tlt/capture/hook_s",
            "tlt/drafter/version",
            "tlt/capture/settle_s",
        ):
            assert key in tlt, f"step {m['step']}: missing {key}"
        assert tlt["tlt/sd/step_share"] > 0 and tlt["tlt/sd/acceptance_length"] >= 1.0
        assert tlt["tlt/capture/samples"] > 0
        # The servers' record of a step is that step's rollout alone, not also the validation before it.
        assert tlt["tlt/rollout/time_s"] <= m["timing_s/gen"], f"step {m['step']}: {tlt['tlt/rollout/time_s']}"
        # The engines worked during the rollout, and no request arrived after the last response finished.
        assert tlt["tlt/rollout/engine_busy_s"] > 0
        assert 0 <= tlt["tlt/rollout/last_submit_s"] <= tlt["tlt/rollout/time_s"]
    assert any(k.startswith("val-") for k in on.metrics[1]), "validation did not run after step 2"
    # Both sources drafted in the run: every arm of a bucket is played first (min_samples), whatever the timings. Which
    # source a later step prefers is the bandit's call on measured step times, so no single step must show both.
    for source in ("eagle", "suffix"):
        assert any(tlt_metrics(m).get(f"tlt/sd/source/{source}/draft_share", 0) > 0 for m in on.metrics), source
    # Every training request named its group, and each group's two samples reached one replica (16 prompts a step).
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    training = [r for r in records if not r.get("validation")]
    assert all(r["grouped_requests"] == len(r["response_tokens"]) > 0 for r in training), training
    for step in range(3):
        assert sum(r["groups"] for r in training if r["rollout_index"] == step) == 16, training
    # The drafter is scored by bursts, between their steps, on captures of an earlier step: never at the step's end.
    # Whether a burst finishes a score depends on how long the toy's tail lasts (tests/drafter/test_worker.py scores
    # deterministically); what is reported must be of an earlier step's captures.
    for m in on.metrics:
        assert "tlt/drafter/eval_skipped" in m
        if "tlt/drafter/eval_online_accept_prob" in m:
            assert m["tlt/drafter/eval_step"] < m["step"] and "tlt/drafter/eval_frozen_accept_prob" in m
    # Captured at step 1, trained while a replica idled in step 2's rollout (a burst takes a step however short its
    # window: TRAINS_IN_ANY_WINDOW), pushed after step 2.
    last = tlt_metrics(on.metrics[-1])
    assert last["tlt/drafter/total_steps"] >= 1 and last["tlt/drafter/version"] >= 1
    assert any(tlt_metrics(m)["tlt/spot/trained_replica_s"] > 0 for m in on.metrics)
    # Every burst that changed the drafter was checkpointed by its worker (asynchronously, beside verl's checkpoints).
    assert list((root / "on" / "checkpoints" / "tlt_spot").glob(f"worker_*/latest/{TENSORS_FILE}"))
    # That training stops within one optimizer step once the last response finishes is checked by counting steps
    # (tests/drafter/test_trainer.py), not by timing a shared machine here.


def test_resume_continues_the_drafter(world, target, greedy_runs, tmp_path):
    """The checkpoint carries the drafter; the resumed run continues from it."""
    root, runs, extra = greedy_runs
    saved = tlt_metrics(runs["on"].metrics[RESUMED_FROM - 1])
    step_dir = root / "on" / "checkpoints" / f"global_step_{RESUMED_FROM}"
    drafter_dir = step_dir / "tlt_drafter"
    assert (drafter_dir / "meta.json").is_file() and (drafter_dir / "trainer" / STATE_FILE).is_file()
    meta = json.loads((drafter_dir / "meta.json").read_text())
    assert meta["step"] == RESUMED_FROM and "tlt/drafter/checkpoint_failures" not in saved
    # A fresh output folder holding only that checkpoint: verl resumes from it (resume_mode auto) and runs the last
    # step with the same settings.
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(step_dir, checkpoints / step_dir.name)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(RESUMED_FROM))
    settings = [e for e in extra if not e.startswith(("trainer.save_freq", "+actor_rollout_ref.rollout.engine_kwargs"))]
    second = run(
        world,
        target,
        tmp_path,
        steps=GREEDY_STEPS,
        greedy=True,
        tlt=True,
        group_size=2,
        extra=[*settings, "trainer.save_freq=-1"],
    )
    assert [m["step"] for m in second.metrics] == [GREEDY_STEPS]
    log = second.log_path.read_text(errors="replace")
    assert f"resuming at step {RESUMED_FROM} with drafter version {meta['version']} " in log
    resumed = tlt_metrics(second.metrics[0])
    assert resumed["tlt/drafter/version"] >= saved["tlt/drafter/version"]
    assert resumed["tlt/drafter/total_steps"] >= saved["tlt/drafter/total_steps"]
