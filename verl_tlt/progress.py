"""Progress of long work: a line at most every few seconds with what is done, the elapsed time and an estimate.

A user never waits in silence: the toy SFT, the drafter warm-up, the benchmarks and the quickstart's verl runs report
through this. Lines go to a logger (INFO), which the command-line tools show; library code never prints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger("verl_tlt.progress")

# What `update` appends to a line: text, or a function that makes it when a line is due.
Extra = str | Callable[[], str]

# Often enough that a minute never passes without a line, rarely enough that a fast loop does not flood the log.
DEFAULT_EVERY_S = 10.0


def format_duration(seconds: float) -> str:
    """`42 s`, `3 min 05 s`, `1 h 02 min`: short and readable at any scale."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """Reports `done/total` of one piece of work at most every `every_s` seconds, with elapsed time and ETA.

    `update(done)` is cheap to call on every step: it only formats a line when one is due (and always for the last
    step). The estimate assumes the remaining units cost what the finished ones did on average.
    """

    def __init__(
        self,
        what: str,
        total: int | None,
        *,
        unit: str = "steps",
        every_s: float = DEFAULT_EVERY_S,
        emit: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total is not None and total < 0:
            raise ValueError(f"Progress({what!r}): total must be >= 0 or None, got {total}")
        if every_s <= 0:
            raise ValueError(f"Progress({what!r}): every_s must be > 0, got {every_s}")
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self._emit = emit or logger.info
        self._clock = clock
        self.start = clock()
        self._last_emit = self.start
        self._finished_reported = False
        self.done = 0

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self.start

    def eta_s(self) -> float | None:
        """Seconds left at the average rate so far; None before the first unit or without a total."""
        if self.total is None or self.done <= 0:
            return None
        return self.elapsed_s / self.done * max(0, self.total - self.done)

    def line(self, extra: str = "") -> str:
        count = f"{self.done}/{self.total} {self.unit}" if self.total is not None else f"{self.done} {self.unit}"
        parts = [f"{self.what}: {count}", f"{format_duration(self.elapsed_s)} elapsed"]
        eta = self.eta_s()
        if eta is not None and self.done < (self.total or 0):
            parts.append(f"about {format_duration(eta)} left")
        if extra:
            parts.append(extra)
        return ", ".join(parts)

    def update(self, done: int, extra: Extra = "") -> bool:
        """Record progress; emit a line if `every_s` has passed since the last one or the work is complete.

        extra: text appended to the line, or a function returning it, called only when a line is emitted (so a
        loop can report e.g. its loss without formatting it on every step).
        """
        self.done = done
        now = self._clock()
        # The line for the last unit comes at once, but only once (later heartbeats wait their turn).
        finished = self.total is not None and done >= self.total and not self._finished_reported
        if now - self._last_emit < self.every_s and not finished:
            return False
        self._last_emit = now
        self._finished_reported = self.total is not None and done >= self.total
        self._emit(self.line(extra() if callable(extra) else extra))
        return True

    def advance(self, units: int = 1, extra: Extra = "") -> bool:
        """`update(done + units)`: for loops that finish units one (or a few) at a time."""
        return self.update(self.done + units, extra)

    def heartbeat(self, extra: Extra = "") -> bool:
        """Emit a line if one is due, without new units done (for waits whose progress is not countable)."""
        return self.update(self.done, extra)
