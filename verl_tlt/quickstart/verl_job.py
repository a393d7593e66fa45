"""Run a verl training job in a subprocess with a hard timeout and collect its per-step metrics.

Used by the CPU quickstart and the end-to-end tests. verl is started as a separate process (not imported)
because a crashed Ray worker tends to hang rather than exit: the timeout must be able to kill everything. The job
runs in its own process group, which is killed on timeout and also when the caller is interrupted (Ctrl-C would
not reach it otherwise). A caller that wants to watch the job passes `on_poll`, called every few seconds with the
path of verl's metrics file (one JSON line per finished step); see `job_progress.JobProgress`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_tlt.quickstart.memory_watch import JobMemoryWatch

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"  # verl's file logger (VERL_FILE_LOGGER_PATH), in the job's folder


@dataclass(frozen=True)
class JobResult:
    returncode: int
    wall_s: float
    log_path: Path
    metrics: list[dict]  # one dict per training step, in step order (verl's file logger)
    rollout_dump_dir: Path
    memory: dict | None = None  # per-component peaks (memory_watch.PeakTracker.report) when the job was watched

    def tail(self, num_lines: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-num_lines:])


class VerlJobError(RuntimeError):
    """The job failed or ran out of time; `result` holds what it left (log, exit code, memory peaks)."""

    def __init__(self, message: str, result: JobResult) -> None:
        super().__init__(message)
        self.result = result


def run_verl_job(
    overrides: list[str],
    out_dir: str | Path,
    *,
    timeout_s: float = 600,
    entry_module: str = "verl.trainer.main_ppo",
    env: dict[str, str] | None = None,
    on_poll: Callable[[Path], None] | None = None,
    poll_s: float = 2.0,
    watch_memory: bool = False,
) -> JobResult:
    """Run `python -m <entry_module> <overrides>`; logs, metrics and rollout dumps go under `out_dir`.

    Adds the file logger and rollout dumps to the overrides. Raises VerlJobError (with the log tail) if the job
    fails or exceeds `timeout_s`; the whole process group is killed on timeout. `on_poll(metrics_path)` is called
    about every `poll_s` seconds while the job runs. `watch_memory` samples the job's processes (and this one, as
    `caller`) as often and puts each component's peak in `JobResult.memory` (see memory_watch).
    """
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path, log_path, dump_dir = out_dir / METRICS_FILE, out_dir / "verl.log", out_dir / "rollouts"
    metrics_path.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        entry_module,
        *overrides,
        "trainer.logger=[console,file]",
        f"trainer.rollout_data_dir={dump_dir}",
        f"trainer.default_local_dir={out_dir / 'checkpoints'}",
    ]
    job_env = {
        **os.environ,
        "VERL_FILE_LOGGER_PATH": str(metrics_path),
        "WANDB_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **(env or {}),
    }
    logger.info("running: %s", " ".join(command))
    start = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=job_env, cwd=out_dir, start_new_session=True
        )
        poll, watch = _poller(process.pid, on_poll, watch_memory)
        try:
            returncode = _wait(process, start + timeout_s, metrics_path, poll, poll_s)
        except BaseException:  # an interrupt or a failing on_poll: the job must not outlive its caller
            _kill(process, job_env)
            raise
        memory = watch.tracker.report() if watch is not None else None
        if returncode is None:
            _kill(process, job_env)
            result = JobResult(-9, time.monotonic() - start, log_path, [], dump_dir, memory)
            message = f"verl job exceeded {timeout_s:.0f} s and was killed; log tail:\n{result.tail()}"
            raise VerlJobError(message, result)
    metrics = read_metrics(metrics_path)
    result = JobResult(returncode, time.monotonic() - start, log_path, metrics, dump_dir, memory)
    if returncode != 0:
        message = f"verl job failed with exit code {returncode}; log {log_path}, tail:\n{result.tail()}"
        raise VerlJobError(message, result)
    return result


def _poller(
    pid: int, on_poll: Callable[[Path], None] | None, watch_memory: bool
) -> tuple[Callable[[Path], None] | None, JobMemoryWatch | None]:
    """What to call at each poll, and the memory watch it samples (None when the job is not watched)."""
    if not watch_memory:
        return on_poll, None
    from verl_tlt.quickstart.memory_watch import JobMemoryWatch

    watch = JobMemoryWatch(pid, caller_pid=os.getpid())

    def poll(metrics_path: Path) -> None:
        watch.sample()
        if on_poll is not None:
            on_poll(metrics_path)

    return poll, watch


def _wait(
    process: subprocess.Popen,
    deadline: float,
    metrics_path: Path,
    on_poll: Callable[[Path], None] | None,
    poll_s: float,
) -> int | None:
    """The job's exit code, or None when `deadline` (monotonic) passed first."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            return process.wait(timeout=min(poll_s, left) if on_poll else left)
        except subprocess.TimeoutExpired:
            if on_poll is not None:
                on_poll(metrics_path)


def _kill(process: subprocess.Popen, env: dict[str, str]) -> None:
    try:  # the group outlives its leader while any member (a Ray worker) is alive
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    _stop_ray(env)


def metrics_row(line: str | bytes) -> dict:
    """One line of verl's file logger, {"step": n, "data": {...}}, as {"step": n, **data}."""
    row = json.loads(line)
    return {"step": row["step"], **row["data"]}


def read_metrics(path: Path) -> list[dict]:
    """Every step's metrics from verl's file logger, in step order."""
    if not path.exists():
        return []
    rows = [metrics_row(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["step"])


def read_rollouts(dump_dir: Path, step: int) -> list[dict]:
    """Rollout samples verl dumped for `step` (trainer.rollout_data_dir): input, output, score, ..."""
    path = Path(dump_dir) / f"{step}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _stop_ray(env: dict[str, str]) -> None:
    # A killed driver can leave a local Ray cluster behind; stop it so the next job starts clean.
    ray_cli = Path(sys.executable).parent / "ray"
    if ray_cli.exists():
        subprocess.run([str(ray_cli), "stop", "--force"], env=env, capture_output=True, timeout=60, check=False)
