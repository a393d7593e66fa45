"""The per-rollout record both TLT rollout servers keep, written once: the drain wait and the last record.

A server mixes `RolloutBookkeeping` in, owns `trace` (a RolloutTrace it feeds with submits and finishes) and
`last_rollout`, and says how many requests it has in flight (`_num_in_flight`). The mixin then answers the
runtime's `wait_for_drain` and `pop_last_rollout` (see control.contract.RolloutControl) and closes records for it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from verl_tlt.metrics.rollout_trace import RolloutTrace


class RolloutBookkeeping:
    trace: RolloutTrace
    last_rollout: dict[str, Any] | None

    def _num_in_flight(self) -> int:
        raise NotImplementedError

    async def wait_for_drain(self, poll_s: float = 0.01) -> float | None:
        """Return when this replica has served requests in the current rollout and has none left in flight: the
        wall-clock time it drained, or None when the rollout ended (sleep) first.

        The TLT coordinator keeps one such call per replica outstanding instead of polling in-flight counts over RPC,
        which on a busy CPU replica costs the rollout measurable time. Checks run on the actor's event loop every
        `poll_s` (microseconds each).
        """
        rollout = self.trace.num_closed
        while self.trace.num_closed == rollout:
            if self.trace.start is not None and self._num_in_flight() == 0:
                return time.time()
            await asyncio.sleep(poll_s)
        return None

    def _close_rollout_record(self, extra: dict[str, Any], validation: bool) -> dict[str, Any] | None:
        """Close the current record (None if nothing was served); a training rollout's becomes `last_rollout`."""
        record = self.trace.close(extra, validation=validation)
        if record is not None and not validation:
            self.last_rollout = record
        return record

    def pop_last_rollout(self) -> dict[str, Any] | None:
        """The record of the latest finished rollout (see RolloutTrace), once."""
        record, self.last_rollout = self.last_rollout, None
        return record
