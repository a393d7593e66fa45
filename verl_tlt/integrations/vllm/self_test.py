"""The drafter's self-test on a vLLM replica: one greedy probe request, scored by vLLM's own acceptance counts.

The torch engine scores its drafter teacher-forced (`engine.drafts.self_test`); vLLM's drafter lives in the engine's
worker processes, out of reach of a forward of our own. So the vLLM replica asks its engine for what a rollout would
see: the first prompt it served, continued greedily by `tlt.drafter.self_test_tokens` with speculation on (a batch of
one is below any threshold), and reads the draft tokens verified and accepted for that request alone
(`SpecStepCounter.probing`). The rate is accepted / drafted over the chain, not the torch test's first-token
agreement: each replica judges against its own last passing rate (`DrafterSelfTest.record`), measured the same way.

Greedy, so the probe draws nothing from any random generator and leaves the rollouts' samples as they were; the
bookkeeping and the rollout's stats never see it. The K policy does observe its steps (timings only: K never changes
what is sampled).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from verl_tlt.engine.drafts.self_test import DrafterSelfTest, ProbeScore, Verdict
from verl_tlt.integrations.vllm.spec_stats import SpecStepCounter

# (prompt token ids, tokens to generate) -> a greedy request through the engine, awaited to its end.
ProbeRequest = Callable[[list[int], int], Awaitable[Any]]


async def probe_vllm_drafter(test: DrafterSelfTest, counter: SpecStepCounter, request: ProbeRequest) -> Verdict:
    """Run the probe and judge it (`test.record`). Skipped (passes, no score) when the test is off, no prompt has been
    served yet, or the engine drafted nothing for the probe (the policy chose plain decoding: no evidence either way).
    Call with nothing else running on the engine."""
    if not test.enabled or not test.probes:
        return Verdict(True)
    start = time.perf_counter()
    error = None
    with counter.probing() as tally:
        try:
            await request(test.probes[0], test.tokens)
        except Exception as failure:  # a drafter that breaks the engine's step is what the test is for
            error = f"{type(failure).__name__}: {failure}"
    if error is None and tally.drafted == 0:
        return Verdict(True)
    return test.record(ProbeScore(tally.drafted, tally.accepted, time.perf_counter() - start, error))


class DrafterExports:
    """Which drafter export a vLLM replica runs and which one it falls back to: the bookkeeping of the self-test's
    decisions, apart from the engine calls (pure: the server does the loads and deletes it names).

    A version loaded since the last test is untested; the last tested version's export is kept until the new one
    passes, so a refusal can load it back. Exports are never deleted while they may be needed: `loaded` and `tested`
    return the folders that can go.
    """

    def __init__(self, folder: Path, version: int):
        self.folder, self.version = folder, version
        self.fallback: tuple[Path, int] | None = None  # the last tested drafter, while a newer one is untested

    def loaded(self, folder: Path, version: int) -> list[Path]:
        """A new version now runs untested; the folders no longer needed (an untested version it replaced)."""
        previous = self.folder
        if self.fallback is None:
            self.fallback = (previous, self.version)
        self.folder, self.version = folder, version
        return [] if previous == self.fallback[0] else [previous]

    def tested(self, passed: bool) -> tuple[tuple[Path, int] | None, list[Path]]:
        """After a test of the running drafter: (the export to load back, or None to keep it), and the folders that
        can go. A failing untested version falls back to the last tested one; a failing tested one has nothing to
        fall back to (the server reloads its own files)."""
        fallback, self.fallback = self.fallback, None
        if fallback is None:
            return None, []
        if passed:
            return None, [fallback[0]]
        refused = self.folder
        self.folder, self.version = fallback
        return fallback, [refused]
