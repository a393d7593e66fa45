"""A `Progress` on a fake clock that records its lines, for tests of who reports what and when."""

from __future__ import annotations

from verl_tlt.progress import Progress


class TickingClock:
    """Each reading is `tick` seconds after the previous one, so a line is due whenever `tick` >= every_s."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def recording_progress(total: int | None, *, every_step: bool = False) -> tuple[Progress, list[str]]:
    """A Progress whose lines land in the returned list: one per update (every_step) or only the last one."""
    lines: list[str] = []
    clock = TickingClock(20.0 if every_step else 0.0)
    return Progress("probe", total, every_s=10.0, emit=lines.append, clock=clock), lines
