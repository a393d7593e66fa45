"""Running the quickstart: its stages (the toy world, target and drafter, or a real model, its tasks and drafter; then
one verl job per run), each timed, the verl jobs with progress lines while they run, and the summary of it all
(written as summary.json)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_tlt.metrics.decode_metrics import ms_per_token_by_batch
from verl_tlt.progress import format_duration
from verl_tlt.quickstart.apart import own_memory, run_apart
from verl_tlt.quickstart.identity import identity_by_run, responses_by_step, same_responses_steps
from verl_tlt.quickstart.job_progress import JobProgress
from verl_tlt.quickstart.recipe import (
    BASELINE,
    COMPARED,
    CONTROL,
    GROUP_DRAFTS,
    INIT_FROM_TARGET,
    RUNS,
    SETUP_STAGE,
    TOY,
    TOY_DRAFTER_OVERRIDES,
    TRACE_FILE,
    GRPOSettings,
    QuickstartInputs,
    check_same_tokenizer,
    quickstart_overrides,
    run_overrides,
)
from verl_tlt.quickstart.summary import LAST_STEPS, group_drafts_headline, headline, read_trace, step_rows
from verl_tlt.quickstart.verl_job import read_rollouts, run_verl_job

logger = logging.getLogger(__name__)

# Set by recipes/quickstart_cpu.sh: the seconds `scripts/setup_env.sh` took (creating or checking the virtualenv),
# which happens before Python starts and so cannot be timed from here.
SETUP_SECONDS_ENV = "VERL_TLT_SETUP_S"


class StageTimer:
    """Wall seconds per named stage, in the order the stages ran."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds: dict[str, float] = {}
        self._clock = clock

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = self._clock()
        yield
        self.add(name, self._clock() - start)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = round(seconds, 1)
        logger.info("stage %s: %s", name, format_duration(seconds))


def setup_seconds(environ: Mapping[str, str] = os.environ) -> float | None:
    """The setup stage's seconds passed in by the recipe script, or None when not run through it."""
    value = environ.get(SETUP_SECONDS_ENV)
    if value is None or value == "":
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(
            f"{SETUP_SECONDS_ENV}={value!r} is not a number of seconds >= 0 (recipes/quickstart_cpu.sh sets it to "
            f"how long the virtualenv setup took); unset it or set a number"
        )
    return seconds


def prepare_toy(cache: Path, timer: StageTimer, family: str = "eagle", warm_drafter: bool = True) -> QuickstartInputs:
    """The toy world, the SFT toy target and its warmed-up drafter of `family` (unless warm_drafter is False: then
    the drafter starts from the target): built once into `cache`, reused."""
    from verl_tlt.toy.build import build_toy_world
    from verl_tlt.toy.drafter import ensure_toy_drafter
    from verl_tlt.toy.sft import DRIFTING_COMPACT_SHARE, ensure_toy_target

    with timer.stage("toy world"):
        world = build_toy_world(cache / "toy-world")
    logger.info("toy world: %s", world.root)
    with timer.stage("toy target"):
        target = ensure_toy_target(cache, compact_share=DRIFTING_COMPACT_SHARE)
        check_same_tokenizer(world.model_dir, target)
    drafter: Path | str = INIT_FROM_TARGET
    if warm_drafter:
        with timer.stage("drafter"):
            drafter = ensure_toy_drafter(cache, compact_share=DRIFTING_COMPACT_SHARE, family=family)
    logger.info("actor: toy target %s; drafter: %s", target, drafter)
    return QuickstartInputs(
        model=TOY,
        train_files=world.train_parquet,
        val_files=world.val_parquet,
        actor=target,
        drafter=drafter,
        reward_fn=str(world.reward_fn),
        # The concise reward moves the policy towards the compact style the drafter rarely saw: it drifts.
        reward_name="compute_score_concise",
        max_prompt_length=16,
        tlt_overrides=(*TOY_DRAFTER_OVERRIDES, f"tlt.drafter.family={family}"),
    )


@dataclass(frozen=True)
class RunResult:
    rows: list[dict]  # summary.step_rows
    responses: dict[int, list[tuple[str, str]]]  # identity.responses_by_step
    decode: dict[str, dict[str, float]]  # decode ms per token by batch-size group (ms_per_token_by_batch)
    wall_s: float
    memory: dict | None = None  # each component's peak memory (memory_watch.PeakTracker.report)


def run_one(
    name: str,
    common: list[str],
    run_dir: Path,
    *,
    steps: int,
    timeout_s: float,
    expected_s: float | None = None,
    model: str = TOY,
) -> RunResult:
    """One run of the comparison as a verl job, reporting its progress, and what its outputs say per step."""
    run_dir = run_dir.resolve()
    (run_dir / TRACE_FILE).unlink(missing_ok=True)
    logger.info("run %s (%d steps)", name, steps)
    progress = JobProgress(name, steps, expected_s=expected_s)
    result = run_verl_job(
        run_overrides(name, common, run_dir),
        run_dir,
        timeout_s=timeout_s,
        entry_module="verl_tlt.main_ppo",
        on_poll=progress,
        watch_memory=True,
    )
    rollouts = {m["step"]: read_rollouts(result.rollout_dump_dir, m["step"]) for m in result.metrics}
    trace = read_trace(run_dir / TRACE_FILE)
    decode = ms_per_token_by_batch([r.get("decode_costs") or {} for records in trace.values() for r in records])
    rows = step_rows(result.metrics, trace, rollouts, toy_styles=model == TOY)
    return RunResult(rows, responses_by_step(rollouts), decode, result.wall_s, result.memory)


def run_comparison(
    cache: Path,
    out: Path,
    *,
    runs: Sequence[str] = tuple(RUNS),
    settings: GRPOSettings,
    timeout_s: float,
    extra: Sequence[str] = (),
    model: str = TOY,
    family: str = "eagle",
    warm_drafter: bool = True,
) -> dict[str, Any]:
    """All stages of the quickstart; returns its summary (see the keys below). family: the drafter family every TLT
    run trains (and warms up, on the toy). warm_drafter: False starts TLT's drafter from the target
    (tlt.drafter.init=target) and builds none."""
    timer = StageTimer()
    setup = setup_seconds()
    if setup is not None:
        timer.add(SETUP_STAGE, setup)
    missing = [name for name in RUNS if name not in runs]
    if missing:
        logger.warning("runs %s left out (--runs): the report will lack what needs them", missing)
    # In a child process: the verl runs get the machine a run with everything cached gets (see quickstart.apart).
    inputs, stage_s = run_apart(prepare_inputs, model, cache, out / "data", settings, family, warm_drafter)
    timer.seconds.update(stage_s)  # timed and logged in the child
    caller_memory = {"at_first_run_start": own_memory()}
    logger.info(
        "the quickstart holds %.2f GiB resident as the first verl run starts (its inputs were built apart)",
        caller_memory["at_first_run_start"]["rss_gib"],
    )
    common = quickstart_overrides(inputs, settings, extra)
    results: dict[str, RunResult] = {}
    for name in runs:
        previous = list(results.values())[-1].wall_s if results else None
        with timer.stage(f"verl run: {name}"):
            results[name] = run_one(
                name, common, out / name, steps=settings.steps, timeout_s=timeout_s, expected_s=previous, model=model
            )
    caller_memory["at_end"] = own_memory()
    summary = build_summary(
        results,
        timer.seconds,
        replicas=settings.replicas,
        overrides=common,
        missing=missing,
        rollout=settings.rollout,
        model=model,
        family=family,
    )
    return {**summary, "quickstart_memory": caller_memory}


def prepare_inputs(
    model: str, cache: Path, data_dir: Path, settings: GRPOSettings, family: str, warm_drafter: bool = True
) -> tuple[QuickstartInputs, dict[str, float]]:
    """The runs' inputs (the toy's world, target and drafter, or a real model, its tasks and drafter; built once into
    `cache`) and each stage's seconds. Run apart (`run_apart`): it loads and trains models. warm_drafter=False: no
    drafter is built; TLT's starts from the target."""
    timer = StageTimer()
    if model == TOY:
        return prepare_toy(cache, timer, family, warm_drafter), timer.seconds
    from verl_tlt.quickstart.real_model import prepare_real_model

    return prepare_real_model(model, cache, data_dir, settings, timer, warm_drafter), timer.seconds


def group_drafts_summary(runs: dict[str, list[dict]]) -> dict[str, Any]:
    """The group-drafts run against the TLT run (the drafter alone), with the control's rollout-time ratio beside it:
    how much two runs of one config differ on this machine by chance."""
    summary = group_drafts_headline(runs, GROUP_DRAFTS, "tlt")
    if BASELINE in runs and CONTROL in runs:
        control = sum(r.get("rollout_s") or 0.0 for r in runs[CONTROL][-LAST_STEPS:])
        base = sum(r.get("rollout_s") or 0.0 for r in runs[BASELINE][-LAST_STEPS:])
        summary["control_rollout_time_ratio_last3"] = control / base if base else None
    return summary


# Why the TLT runs' responses may differ from the baseline's on vLLM, and how to get a token-for-token comparison.
VLLM_IDENTITY_NOTE = (
    "on vLLM, sampled speculative decoding keeps the target's distribution but draws other samples than plain "
    "decoding (its rejection sampler uses the random numbers differently), and vLLM's servers record no weight "
    "checksums: expect TLT runs to match the baseline token for token only with greedy rollouts "
    "(--override actor_rollout_ref.rollout.top_k=1)"
)


def build_summary(
    results: dict[str, RunResult],
    stage_s: dict[str, float],
    *,
    replicas: int,
    overrides: list[str],
    missing: list[str],
    rollout: str = "torch",
    model: str = TOY,
    family: str = "eagle",
) -> dict[str, Any]:
    runs = {name: r.rows for name, r in results.items()}
    responses = {name: r.responses for name, r in results.items()}
    job = "toy GRPO" if model == TOY else f"GRPO of {model} on reasoning-gym tasks"
    drafter = "EAGLE-3" if family == "eagle3" else "EAGLE"
    return {
        "job": f"{job} on CPU, {rollout} rollout, {replicas} replicas: baseline vs TLT ({drafter} drafter) vs TLT "
        f"with a frozen drafter, and the baseline repeated ({CONTROL}) as a control",
        "model": model,
        "drafter_family": family,
        "missing_runs": missing,
        **(headline(runs) if all(name in runs for name in COMPARED) else {}),
        **({"group_drafts": group_drafts_summary(runs)} if GROUP_DRAFTS in runs and "tlt" in runs else {}),
        # Per run and step against the baseline: rollout weights bitwise equal? sampled responses equal?
        "identity": identity_by_run(runs, responses),
        **({"identity_note": VLLM_IDENTITY_NOTE} if rollout == "vllm" else {}),
        "steps_with_baseline_responses": same_responses_steps(responses),
        # Decode ms per committed token by batch-size group (powers of two), plain and speculative steps, over the
        # run's rollouts: whether speculation paid at each batch size. Plain and SD steps of one run ran at the same
        # moments; across runs the machine's drift is in the comparison too.
        "decode_ms_per_token_by_batch": {name: r.decode for name, r in results.items()},
        "stage_s": stage_s,
        "wall_s": {name: round(r.wall_s, 1) for name, r in results.items()},
        # Each component's peak PSS per run (driver, verl's workers, rollout servers, drafter workers, Ray itself).
        "memory_peaks": {name: r.memory for name, r in results.items() if r.memory},
        "runs": runs,
        "overrides": overrides,
    }
