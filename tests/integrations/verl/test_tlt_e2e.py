"""TLT through a real verl run on CPU: lossless, measured, resumable, and robust to a dying drafter worker.

Every job is a real `python -m verl_tlt.main_ppo` run (two rollout replicas, the SFT toy target, a few steps)
under a hard timeout. The drafter starts from the target (tlt.drafter.init=target), so nothing but the toy
target needs to be built.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from verl_tlt.drafter.safe_state import STATE_FILE, TENSORS_FILE
from verl_tlt.integrations.verl.same_samples import SAME_SAMPLES_OVERRIDES
from verl_tlt.metrics.rollout_trace import rollout_weights_sha256
from verl_tlt.quickstart.recipe import toy_grpo_overrides
from verl_tlt.quickstart.verl_job import read_rollouts, run_verl_job
from verl_tlt.toy.build import build_toy_world
from verl_tlt.toy.sft import ensure_toy_target

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ENTRY = "verl_tlt.main_ppo"
JOB_TIMEOUT_S = 420
NO_PLAIN_ARM = 1000  # above any threshold: every bucket's arms are SD strategies only
DENSE_REWARD = str(Path(__file__).with_name("dense_reward.py"))


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
            world, target, root / name, steps=GREEDY_STEPS, greedy=True, tlt=tlt, group_size=2, extra=validate + extra
        )
        for name, tlt, extra in (("off", False, []), ("on", True, tlt_extra))
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
            "tlt/capture/samples",
            "tlt/capture/hook_s",
            "tlt/drafter/version",
            "tlt/drafter/eval_online_accept_prob",
            "tlt/drafter/eval_frozen_accept_prob",
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
    # Captured at step 1, trained while a replica idled in step 2's rollout, pushed after step 2.
    last = tlt_metrics(on.metrics[-1])
    assert last["tlt/drafter/total_steps"] >= 1 and last["tlt/drafter/version"] >= 1
    assert any(tlt_metrics(m)["tlt/spot/trained_replica_s"] > 0 for m in on.metrics)
    # Every burst that changed the drafter was checkpointed by its worker (asynchronously, beside verl's checkpoints).
    assert list((root / "on" / "checkpoints" / "tlt_spot").glob(f"worker_*/latest/{TENSORS_FILE}"))
    # That training stops within one optimizer step once the last response finishes is checked by counting steps
    # (tests/drafter/test_trainer.py), not by timing a shared machine here.


SAMPLED_STEPS = 2  # two rollouts: the second one's weights came from an update in each run
CRASH = {"VERL_TLT_DRAFTER_FAULT": "exit_on_start=1"}


@pytest.fixture(scope="module")
def sampled_runs(world, tmp_path_factory):
    """The sampled pair of runs, TLT off and on; the TLT run's first drafter worker dies as it starts.

    One pair serves two claims: losslessness does not depend on the drafter (a crashed worker leaves the replicas
    speculating with the drafter they had), so the run that shows a crash does not stop RL shows identity too.
    """
    # The slot-seeded agent loop seeds each request from its sample slot (request_seeds), and the slot-ordered
    # sampler trains on every batch in slot order (same_samples). Speculative decoding emits plain decoding's samples
    # under keyed sampling, so with the policy moving (lr 1e-3, REINFORCE++ on a dense reward) and 2 samples per
    # prompt, the weights and every step's sampled responses must be the same with TLT on and off.
    # The policy is the world's untrained model: randomly initialised with small weights, its next-token distribution
    # is close to uniform over the vocabulary by construction (not by what training on this host produced), so two
    # samples of a prompt, dozens of tokens each, essentially never coincide (both ending at once is the likeliest
    # way, about p(eos)^2 per pair). That makes "really sampled" checkable:
    # under greedy decoding the two samples of every prompt would be the same response and no pair would differ.
    root = tmp_path_factory.mktemp("sampled")
    runs = {}
    for name, tlt, env in (("off", False, None), ("on", True, CRASH)):
        trace = f"+actor_rollout_ref.rollout.engine_kwargs.torch.trace_path={root / name}.jsonl"
        runs[name] = run(
            world,
            None,
            root / name,
            steps=SAMPLED_STEPS,
            greedy=False,
            tlt=tlt,
            group_size=2,
            reward_fn=DENSE_REWARD,
            extra=[*SAME_SAMPLES_OVERRIDES, trace],
            env=env,
        )
    return root, runs


def test_sampled_rollouts_are_identical_with_tlt_on_and_off(sampled_runs):
    root, runs = sampled_runs
    off, on = runs["off"], runs["on"]
    steps = list(range(1, SAMPLED_STEPS + 1))
    weights = {}
    for name in ("off", "on"):  # every training request came with its slot's seed; every record has its weights
        records = [json.loads(line) for line in (root / f"{name}.jsonl").read_text().splitlines()]
        assert all(r["seeded_requests"] == len(r["response_tokens"]) > 0 for r in records), (name, records)
        by_step = [[r for r in records if r["rollout_index"] == i] for i in range(SAMPLED_STEPS)]
        weights[name] = [rollout_weights_sha256(step_records) for step_records in by_step]
        assert None not in weights[name], f"{name}: replicas without a checksum or disagreeing: {records}"
        assert len(set(weights[name])) == SAMPLED_STEPS, f"{name}: the rollout weights did not change between steps"
    # Batches trained on in slot order (the slot-ordered sampler): TLT changes nothing in training, bit for bit.
    assert weights["on"] == weights["off"], "TLT changed the actor's training (rollout weights differ)"
    off_responses, on_responses = responses_by_step(off), responses_by_step(on)
    assert sorted(off_responses) == sorted(on_responses) == steps
    for step in steps:
        assert len(off_responses[step]) == 32
        assert on_responses[step] == off_responses[step], f"step {step}: TLT changed a sampled rollout"
        # Really sampled: the two samples of a prompt differ (greedy: 0 of 16 would).
        outputs = off_responses[step]
        assert sum(a[1] != b[1] for a, b in zip(outputs[::2], outputs[1::2], strict=True)) >= 14
    assert sum(m["tlt/sd/step_share"] for m in on.metrics) > 0, "TLT must have speculated"
    assert all(m["training/rollout_probs_diff_max"] < 1e-4 for m in on.metrics), "SD log-probs must be the target's"
    # TLT's entry point with TLT off is stock verl: it trains, and its rollouts carry the trainer's log-probs.
    assert not any(k.startswith("tlt/") for m in off.metrics for k in m), "TLT off must log nothing of TLT"
    for m in off.metrics:
        assert m["actor/grad_norm"] > 0 and math.isfinite(m["actor/grad_norm"])
        assert m["training/rollout_probs_diff_max"] < 1e-4


def test_a_crashing_drafter_worker_does_not_stop_the_run(sampled_runs):
    _, runs = sampled_runs
    result = runs["on"]
    assert [m["step"] for m in result.metrics] == list(range(1, SAMPLED_STEPS + 1))
    log = result.log_path.read_text(errors="replace")
    assert "TLT drafter worker" in log and "The RL run continues" in log
    last = tlt_metrics(result.metrics[-1])
    assert last["tlt/drafter/worker_failures"] >= 1
    assert last["tlt/drafter/workers_alive"] <= 1
    # The replicas keep speculating with the drafter they had.
    assert all(tlt_metrics(m)["tlt/sd/step_share"] > 0 for m in result.metrics)


def test_resume_continues_the_drafter(world, target, greedy_runs, tmp_path):
    root, runs, extra = greedy_runs
    saved = tlt_metrics(runs["on"].metrics[RESUMED_FROM - 1])
    step_dir = root / "on" / "checkpoints" / f"global_step_{RESUMED_FROM}"
    drafter_dir = step_dir / "tlt_drafter"
    assert (drafter_dir / "meta.json").is_file() and (drafter_dir / "trainer" / STATE_FILE).is_file()
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
    assert f"drafter version {int(saved['tlt/drafter/version'])} restored" in log
    resumed = tlt_metrics(second.metrics[0])
    assert resumed["tlt/drafter/version"] >= saved["tlt/drafter/version"]
    assert resumed["tlt/drafter/total_steps"] >= saved["tlt/drafter/total_steps"]
