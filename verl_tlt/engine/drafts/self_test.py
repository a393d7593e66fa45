"""A drafter that checks itself: score it by serving fixed probe prompts; refuse one far below the last that passed.

Serving systems in this field have failed silently with a drafter that accepts nothing after a sleep, a weight sync
or a bad vocabulary map (reported for SGLang, NeMo-RL and verl's MTP rollout): outputs stay correct because
verification is lossless, so the only symptom is speculation that costs instead of pays. The self-test decodes a
few fixed probe prompts greedily with a chain of the drafter and counts the draft tokens accepted; `judge` refuses a
drafter whose share is far below the last passing drafter's. Probes are the first prompts the engine's server
served (the task's own text: a drafter accepts next to nothing on arbitrary tokens), so the test starts with the
first rollout.

The probe runs on the engine between rollouts: greedy, with a fixed seed (it draws nothing from the engine's random
generator, so the rollouts sample exactly what they would have), its steps counted apart from the rollout's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from verl_tlt.engine.sampling_params import SamplingParams
from verl_tlt.policy.decode_stats import DecodeCosts, DecodeStats
from verl_tlt.spec.strategy import SpecStrategy

if TYPE_CHECKING:
    from verl_tlt.engine.engine import RolloutEngine

# Below this share of accepted draft tokens the reference cannot tell a broken drafter from an untrained one.
MIN_REFERENCE_RATE = 0.1
PROBE_PROMPTS = 2
PROBE_DEPTH = 4  # the chain the probe drafts with (the CPU recipes' deepest default chain)


@dataclass(frozen=True)
class ProbeScore:
    """What one probe measured: draft tokens verified and accepted, and the probe's wall time."""

    drafted: int
    accepted: int
    seconds: float
    drafter_error: str | None = None  # the drafter raised during the probe (the engine turned it off)

    @property
    def rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class Verdict:
    """passed: keep the drafter. score: None when the test was skipped (off, or no probe prompts yet)."""

    passed: bool
    score: ProbeScore | None = None
    reason: str | None = None


def judge(score: ProbeScore, reference: float | None, min_ratio: float) -> str | None:
    """Why `score` fails against the last passing drafter's rate (`reference`), or None when it passes."""
    if score.drafter_error is not None:
        return f"the drafter failed on the probe ({score.drafter_error})"
    if reference is None or reference < MIN_REFERENCE_RATE:
        return None
    if score.rate < min_ratio * reference:
        return (
            f"it accepted {score.rate:.1%} of its probe draft tokens, below {min_ratio:g} x the last passing "
            f"drafter's {reference:.1%}"
        )
    return None


def probe_acceptance(engine: RolloutEngine, prompts: Sequence[Sequence[int]], tokens: int) -> ProbeScore:
    """Decode `tokens` greedy tokens of each prompt with the engine's drafter (a chain of PROBE_DEPTH, or shorter
    when the engine verifies fewer draft tokens); the engine's counters do not see these steps."""
    depth = min(PROBE_DEPTH, engine.max_draft_tokens)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, seed=0)
    counters = engine.stats, engine.decode_costs
    engine.stats, engine.decode_costs = DecodeStats(), DecodeCosts()  # the probe's steps are not the rollout's
    start = time.perf_counter()
    try:
        outputs = engine.generate(prompts, params, strategy=SpecStrategy(depth=depth))
    finally:
        engine.stats, engine.decode_costs = counters
    drafted = sum(o.stats["num_draft_tokens"] for o in outputs)
    accepted = sum(o.stats["num_accepted_tokens"] for o in outputs)
    return ProbeScore(drafted, accepted, time.perf_counter() - start, engine.drafter_error)


class DrafterSelfTest:
    """One engine's self-test: its probe prompts, the last passing rate, and counters until `take()`."""

    def __init__(self, tokens: int, min_ratio: float, max_model_len: int):
        self.tokens, self.min_ratio, self.max_model_len = tokens, min_ratio, max_model_len
        self.probes: list[list[int]] = []
        self.reference: float | None = None  # the rate of the last drafter that passed
        self._reset_counts()

    def _reset_counts(self) -> None:
        self.runs = self.refused = 0
        self.seconds = 0.0
        self.last_rate: float | None = None
        self.last_reason: str | None = None

    @property
    def enabled(self) -> bool:
        return self.tokens > 0

    def remember(self, prompt_ids: Sequence[int]) -> None:
        """Keep the first PROBE_PROMPTS distinct prompts that leave room for the probe's tokens."""
        if not self.enabled or len(self.probes) >= PROBE_PROMPTS or len(prompt_ids) + self.tokens > self.max_model_len:
            return
        prompt = [int(t) for t in prompt_ids]
        if prompt not in self.probes:
            self.probes.append(prompt)

    def check(self, engine: RolloutEngine) -> Verdict:
        """Score the engine's drafter; a passing one becomes the reference. Call with no requests in flight."""
        if not self.enabled or not self.probes or engine.drafter is None:
            return Verdict(True)
        score = probe_acceptance(engine, self.probes, self.tokens)
        reason = judge(score, self.reference, self.min_ratio)
        self.runs += 1
        self.seconds += score.seconds
        self.last_rate = score.rate
        if reason is None:
            self.reference = score.rate
            return Verdict(True, score)
        self.refused += 1
        self.last_reason = reason
        return Verdict(False, score, reason)

    def counts(self) -> dict[str, Any]:
        """Runs, refusals, seconds and the last rate since the last take (for tlt/drafter/self_test_*)."""
        return {
            "runs": self.runs,
            "refused": self.refused,
            "seconds": self.seconds,
            "last_rate": self.last_rate,
            "last_reason": self.last_reason,
        }

    def take(self) -> dict[str, Any]:
        """`counts()`, and start afresh."""
        taken = self.counts()
        self._reset_counts()
        return taken
