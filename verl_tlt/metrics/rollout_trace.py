"""What one rollout replica did during one rollout (from its first request to its sleep): when each response
finished, how long it was, and how its speculative decoding went.

The torch rollout server keeps one `RolloutTrace`; the TLT trainer collects the record of every replica after each
rollout for the `tlt/tail/*` and `tlt/sd/*` metrics, and, when `engine_kwargs.torch.trace_path` is set, the server
appends each record to that JSONL file (so a run with TLT off can be measured the same way). Wall-clock times
(`time.time()`), so records of different processes on one machine line up.

With a trace path, a training rollout's record also carries `weights_sha256`, a bitwise checksum of the target
weights the replica sampled it with (`weights_sha256`, computed once per weight load), so two runs can tell whether
their rollouts of a step started from identical weights. verl's weight sync copies the actor's weights into the
replica bit for bit when the rollout holds them in the actor's dtype (fp32 on CPU), so equal checksums then mean the
actor's weights were equal too.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Summed over finished requests: speculative-decoding counters from CompletionOutput.stats.
SD_COUNTERS = ("num_verify_steps", "num_draft_tokens", "num_accepted_tokens", "num_output_tokens")


class RolloutTrace:
    def __init__(self, replica_rank: int, clock: Callable[[], float] = time.time):
        self.replica_rank, self.clock = replica_rank, clock
        self._lock = threading.Lock()
        self.num_closed = 0  # training rollouts recorded so far: the index of the next one
        self._reset()

    def _reset(self) -> None:
        self.start: float | None = None
        self.submit_times: list[float] = []
        self.finish_times: list[float] = []
        # Seconds the engine spent in its steps (prefills and decodes): against the rollout's wall time, how much of
        # it the engine worked (the rest it waited for requests to arrive).
        self.engine_busy_s = 0.0
        self.response_tokens: list[int] = []
        # Per finished request, the position of its submission in submit_times (None where the server did not say):
        # pairs each response's length with its arrival, which the rollout simulator's calibration needs.
        self.finish_submit_index: list[int | None] = []
        self.sd_totals = dict.fromkeys(SD_COUNTERS, 0)

    def on_submit(self) -> int:
        """Record a request's arrival; returns its position in submit_times (for `on_finish`)."""
        with self._lock:
            now = self.clock()
            if self.start is None:
                self.start = now
            self.submit_times.append(now)
            return len(self.submit_times) - 1

    def on_engine_step(self, seconds: float) -> None:
        with self._lock:
            self.engine_busy_s += seconds

    def on_finish(self, num_tokens: int, stats: dict[str, int], submit_index: int | None = None) -> None:
        with self._lock:
            self.finish_times.append(self.clock())
            self.response_tokens.append(num_tokens)
            self.finish_submit_index.append(submit_index)
            for key in SD_COUNTERS:
                self.sd_totals[key] += int(stats.get(key, 0))

    def close(self, extra: dict[str, Any] | None = None, *, validation: bool = False) -> dict[str, Any] | None:
        """End this rollout: its record (None if nothing was submitted), and start a fresh one.

        `rollout_index` counts training rollouts; a validation rollout's record has `"validation": true` and
        rollout_index None, and does not advance the count.
        """
        with self._lock:
            if self.start is None:
                return None
            record = {
                "replica": self.replica_rank,
                "rollout_index": None if validation else self.num_closed,
                "validation": validation,
                "start": self.start,
                "closed": self.clock(),
                "submit_times": list(self.submit_times),
                "finish_times": list(self.finish_times),
                "engine_busy_s": self.engine_busy_s,
                "response_tokens": list(self.response_tokens),
                "finish_submit_index": list(self.finish_submit_index),
                "sd": dict(self.sd_totals),
                **(extra or {}),
            }
            if not validation:
                self.num_closed += 1
            self._reset()
            return record


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def acceptance_length(sd: dict[str, int]) -> float | None:
    """Tokens per verify step including the bonus token; None when nothing was verified."""
    steps = sd.get("num_verify_steps", 0)
    return (sd.get("num_accepted_tokens", 0) + steps) / steps if steps else None


def rollout_summary(records: list[dict[str, Any]]) -> dict[str, float]:
    """One step's rollout across replicas: start (first request in), last finish, closed (the first replica put
    to sleep: the rollout phase's end), SD totals, and where the records have them the engines' busy seconds (summed)
    and the last request's arrival."""
    records = [r for r in records if r is not None]
    if not records:
        return {}
    start = min(r["start"] for r in records)
    finishes = [t for r in records for t in r["finish_times"]]
    sd = {key: sum(r["sd"][key] for r in records) for key in SD_COUNTERS}
    summary = {
        "start": start,
        "last_finish": max(finishes) if finishes else start,
        "closed": min(r["closed"] for r in records),
        "num_responses": len(finishes),
        **sd,
    }
    if all("engine_busy_s" in r for r in records):  # records from before these fields existed lack them
        summary["engine_busy_s"] = sum(r["engine_busy_s"] for r in records)
        summary["last_submit"] = max(t for r in records for t in r["submit_times"])
    length = acceptance_length(sd)
    if length is not None:
        summary["acceptance_length"] = length
    return summary


def weights_sha256(model: torch.nn.Module) -> str:
    """SHA-256 over every parameter of `model` (name, dtype, shape and raw bytes, in name order): equal digests mean
    bitwise-equal weights. Tied parameters count once. Hashes about 1 GB/s on one CPU core: ~4 ms for the
    1M-parameter fp32 toy target, but ~15 s for 7B bf16 weights, which is why only traced rollouts pay for it.
    """
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        tensor = param.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        # Raw bytes whatever the dtype (numpy has no bfloat16): reinterpret the storage as bytes.
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def rollout_weights_sha256(records: list[dict[str, Any]]) -> str | None:
    """The weights checksum of one step's rollout: the replicas' common `weights_sha256`, or None when a record lacks
    it (no trace path, or a record from before checksums) or the replicas disagree (then no claim can rest on it)."""
    digests = {r.get("weights_sha256") for r in records if r is not None}
    if len(digests) != 1 or None in digests:
        return None
    return digests.pop()
