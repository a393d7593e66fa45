"""Which requests wait, which run, and in which cache slot: the engine's request bookkeeping.

`running[i]` occupies KV-cache slot i, and the running batch always fills slots [0, len(running)): a finished
request's slot is taken by the last running one, so the model's forwards read plain views of the cache. Queueing and
aborting are thread-safe (servers call them from their event loop while the engine steps); everything else runs on
the engine's thread.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable

from verl_tlt.engine.request import CompletionOutput, Request


class Scheduler:
    def __init__(self, max_num_seqs: int):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.max_num_seqs = max_num_seqs
        self.running: list[Request] = []
        self.cache_lens: list[int] = []  # tokens already written to the cache, per running request
        self.waiting: deque[Request] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._aborted: set[str] = set()

    def new_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def enqueue(self, request: Request, on_queue: Callable[[Request], None]) -> None:
        """Queue a request; `on_queue` runs under the lock, so what it draws follows the order requests arrive in."""
        with self._lock:
            on_queue(request)
            self.waiting.append(request)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborted.add(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    def admit(self) -> list[Request]:
        """Take waiting requests, oldest first, while the running batch has room."""
        admitted = []
        with self._lock:
            while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
                admitted.append(self.waiting.popleft())
        return admitted

    def start(self, requests: list[Request]) -> None:
        """Admitted requests whose prompts are now in the cache join the running batch (in the next slots)."""
        self.running.extend(requests)
        self.cache_lens.extend(len(r.prompt_ids) for r in requests)

    def collect_aborted(self) -> list[CompletionOutput]:
        """Apply the aborts asked for since the last step: waiting requests finish now (their outputs are returned),
        running ones are marked and leave at the next retirement."""
        with self._lock:
            aborted, self._aborted = self._aborted, set()
            if not aborted:
                return []
            dropped = [r for r in self.waiting if r.request_id in aborted]
            self.waiting = deque(r for r in self.waiting if r.request_id not in aborted)
        for request in self.running:
            if request.request_id in aborted and request.finish_reason is None:
                request.finish_reason = "abort"
        for request in dropped:
            request.finish_reason = "abort"
        return [r.to_output() for r in dropped]

    def retire_finished(
        self, move_slot: Callable[[int, int, int], None], on_retire: Callable[[Request], None]
    ) -> list[CompletionOutput]:
        """Remove finished requests from the running batch; `move_slot(src, dst, length)` moves the last running
        request's cache state into each freed slot, `on_retire` sees each request that leaves."""
        outputs = []
        row = 0
        while row < len(self.running):
            request = self.running[row]
            if request.finish_reason is None:
                row += 1
                continue
            outputs.append(request.to_output())
            on_retire(request)
            last = len(self.running) - 1
            if row != last:
                move_slot(last, row, self.cache_lens[last])
                self.running[row], self.cache_lens[row] = self.running[last], self.cache_lens[last]
            self.running.pop()
            self.cache_lens.pop()
        return outputs

    def reset(self) -> None:
        """Forget every request, waiting and running, without outputs."""
        with self._lock:
            self.waiting.clear()
            self._aborted.clear()
        self.running, self.cache_lens = [], []
