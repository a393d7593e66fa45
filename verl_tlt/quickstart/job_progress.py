"""Progress of a running verl job, from the metrics verl's file logger appends (one JSON line per finished step).

`JobProgress` is the `on_poll` callback of `run_verl_job`: a line at least every `every_s` seconds and on every new
step, through logging. Before step 1 (Ray, the workers and the first rollout starting) it says so, with the elapsed
time; afterwards the step count, the last step's time, its rollout time (measured by the rollout servers when TLT
is on, else verl's `timing_s/gen`), the acceptance length when TLT speculated, and an estimate of what is left.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from verl_tlt.progress import DEFAULT_EVERY_S, format_duration
from verl_tlt.quickstart.verl_job import metrics_row

logger = logging.getLogger(__name__)


class MetricsTail:
    """The complete lines appended to verl's metrics file since the last read, as {"step": n, **metrics} rows."""

    def __init__(self, path: Path) -> None:
        self.path, self._offset = Path(path), 0

    def read_new(self) -> list[dict]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:  # verl creates it with its logger, after Ray and the workers are up
            return []
        if size < self._offset:  # a new file in its place (a restarted job): read it from the start
            self._offset = 0
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(size - self._offset)
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next read
        self._offset += len(complete)
        rows = []
        for line in complete.splitlines():
            try:
                rows.append(metrics_row(line))
            except (ValueError, KeyError, TypeError):
                logger.warning("skipping an unreadable line of %s: %r", self.path, line[:200])
        return rows


class JobProgress:
    """Reports one verl job of `total_steps` steps named `name`; call it with the metrics file's path.

    expected_s: how long the whole job is expected to take (e.g. the previous run's time), for an estimate before
    the first step finishes; later estimates use the job's own mean step time.
    """

    def __init__(
        self,
        name: str,
        total_steps: int,
        *,
        expected_s: float | None = None,
        every_s: float = DEFAULT_EVERY_S,
        emit: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total_steps < 1:
            raise ValueError(f"JobProgress({name!r}): total_steps must be >= 1, got {total_steps}")
        self.name, self.total_steps, self.expected_s, self.every_s = name, total_steps, expected_s, every_s
        self._emit = emit or logger.info
        self._clock = clock
        self.start = self._last_emit = clock()
        self.rows: list[dict] = []
        self._last_step_at = self.start  # when the latest step was seen finished
        self._tail: MetricsTail | None = None

    def __call__(self, metrics_path: Path) -> None:
        if self._tail is None or self._tail.path != Path(metrics_path):
            self._tail = MetricsTail(metrics_path)
        new = self._tail.read_new()
        self.rows.extend(new)
        now = self._clock()
        if new:
            self._last_step_at = now
        if new or now - self._last_emit >= self.every_s:
            self._last_emit = now
            self._emit(self.line())

    def line(self) -> str:
        elapsed = self._clock() - self.start
        if not self.rows:
            text = f"{self.name}: verl starting (Ray, workers) and running step 1/{self.total_steps}"
            text += f", {format_duration(elapsed)} elapsed"
            if self.expected_s is not None and self.expected_s > elapsed:
                text += f", about {format_duration(self.expected_s - elapsed)} left (as long as the previous run)"
            return text
        last = self.rows[-1]
        left = self.total_steps - last["step"]
        text = f"{self.name}: step {last['step']}/{self.total_steps}, {format_duration(elapsed)} elapsed"
        step_times = [r["timing_s/step"] for r in self.rows if isinstance(r.get("timing_s/step"), (int, float))]
        if left > 0 and step_times:
            # The step in progress has run for a while already; it still takes at least as long as the steps after it.
            mean = statistics.mean(step_times)
            eta = max(mean * left - (self._clock() - self._last_step_at), mean * (left - 1))
            text += f", about {format_duration(eta)} left"
        elif left <= 0:
            text += ", verl finishing"
        return text + "; " + _step_details(last)


def _step_details(row: dict) -> str:
    """The last step's time, rollout time and acceptance length, as far as verl logged them."""
    parts = []
    if isinstance(row.get("timing_s/step"), (int, float)):
        parts.append(f"step {row['timing_s/step']:.1f} s")
    if isinstance(row.get("tlt/rollout/time_s"), (int, float)):
        parts.append(f"rollout {row['tlt/rollout/time_s']:.1f} s (server-measured)")
    elif isinstance(row.get("timing_s/gen"), (int, float)):
        parts.append(f"rollout {row['timing_s/gen']:.1f} s (timing_s/gen)")
    if isinstance(row.get("tlt/sd/acceptance_length"), (int, float)):
        parts.append(f"acceptance length {row['tlt/sd/acceptance_length']:.2f}")
    return ", ".join(parts) if parts else "no timings logged"
