"""`verl-tlt bench grpo-memory`: one verl GRPO job on a real model with TLT off, then on, and each component's peak
memory (driver, verl's workers, the rollout servers, the drafter workers, Ray's daemons) side by side.

The question it answers: does a TLT run fit wherever the same run with TLT off fits? The job is GRPO on the
reasoning-gym tasks (`verl-tlt tasks`), sized by the options; both runs share every override but TLT's. A run that
dies (Ray's memory monitor kills a worker, say) is reported with its exit code and the peaks it reached, and the
benchmark goes on to the next run.
"""

from __future__ import annotations

import json
import logging
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

from verl_tlt.quickstart.recipe import CPU_STRATEGY_OVERRIDES, grpo_overrides

logger = logging.getLogger(__name__)

# Run name -> its own overrides (TLT off first: it is the reference the TLT run must fit within).
RUNS: dict[str, list[str]] = {
    "tlt_off": ["tlt.enabled=false"],
    "tlt_on": ["tlt.enabled=true", "tlt.drafter.train=true", *CPU_STRATEGY_OVERRIDES],
}
# GRPO's lr for a small instruct model; memory does not depend on it.
LR = 1e-6


@dataclass(frozen=True)
class MemoryJob:
    """The job both runs share."""

    model: str = "smollm2-135m"
    steps: int = 3
    batch_size: int = 4  # prompts per step
    group_size: int = 4  # samples per prompt
    max_response_length: int = 128
    replicas: int = 2
    drafter: str = "target"  # tlt.drafter.init: 'target' or a warmed-up drafter's folder
    timeout_s: float = 1800  # per run


def run(json_path: str | None, job: MemoryJob, out_dir: str | Path) -> dict:
    """Both runs, the memory table printed; the report written to `json_path` when given."""
    import psutil

    from verl_tlt.quickstart.memory_watch import format_memory_table

    out_dir = Path(out_dir).resolve()
    common = _common_overrides(job, out_dir)
    outcomes = {}
    for name, own in RUNS.items():
        logger.info("run %s: %s", name, " ".join(own))
        outcomes[name] = _run_one(name, [*common, *own], out_dir / name, job)
    total = psutil.virtual_memory().total
    print(format_memory_table({name: outcome["memory"] for name, outcome in outcomes.items()}, total))
    for name, outcome in outcomes.items():
        state = "finished" if outcome["returncode"] == 0 else f"FAILED (exit code {outcome['returncode']})"
        print(f"{name}: {state}, {outcome['steps_done']}/{job.steps} steps in {outcome['wall_s']:.0f} s")
    report = {
        "host": platform.node(),
        "node_total_gib": round(total / 1024**3, 2),
        "job": asdict(job),
        "runs": outcomes,
    }
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2))
    return report


def _common_overrides(job: MemoryJob, out_dir: Path) -> list[str]:
    import verl_tlt.tasks.reward as reward
    from verl_tlt.models.prepare import ensure_model
    from verl_tlt.tasks.dataset import grpo_task_files

    target = ensure_model(job.model)
    data = grpo_task_files(target, out_dir / "data", job.batch_size * job.steps)
    overrides = grpo_overrides(
        train_files=data["train"],
        val_files=data["val"],
        model_dir=target,
        reward_fn=reward.__file__,
        max_prompt_length=data["max_prompt_length"],
        steps=job.steps,
        batch_size=job.batch_size,
        group_size=job.group_size,
        max_response_length=job.max_response_length,
        lr=LR,
        replicas=job.replicas,
        experiment="grpo_memory",
    )
    return [*overrides, f"tlt.drafter.init={job.drafter}"]


def _run_one(name: str, overrides: list[str], run_dir: Path, job: MemoryJob) -> dict:
    from verl_tlt.quickstart.job_progress import JobProgress
    from verl_tlt.quickstart.verl_job import VerlJobError, run_verl_job

    progress = JobProgress(name, job.steps)
    try:
        result = run_verl_job(
            overrides,
            run_dir,
            timeout_s=job.timeout_s,
            entry_module="verl_tlt.main_ppo",
            on_poll=progress,
            watch_memory=True,
        )
        error = None
    except VerlJobError as failed:
        result, error = failed.result, str(failed).splitlines()[0]
        logger.warning("run %s failed: %s (log %s)", name, error, result.log_path)
    return {
        "returncode": result.returncode,
        "error": error,
        "wall_s": round(result.wall_s, 1),
        "steps_done": len(result.metrics),
        "log": str(result.log_path),
        "memory": result.memory,  # always a report: the job was watched
    }
