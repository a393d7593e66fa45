"""A drafter that checks itself: score it on fixed probe tokens; refuse one far below the last that passed.

Serving systems in this field have failed silently with a drafter that accepts nothing after a sleep, a weight sync
or a bad vocabulary map (reported for SGLang, NeMo-RL and verl's MTP rollout): outputs stay correct because
verification is lossless, so the only symptom is speculation that costs instead of pays. The self-test scores the
drafter teacher-forced on fixed probe tokens: one target forward over each probe sequence gives the target's greedy
next token at every position, and one drafter call over PROBE_POSITIONS cut points of each sequence gives the
drafter's; the share that agree is the chance a first greedy draft token is accepted. `judge` refuses a drafter
whose share is far below the last passing drafter's.

Probes are the first prompts the engine's server served (the task's own text: a drafter agrees with next to nothing
on arbitrary tokens), each continued once by the target's greedy answer; the test starts with the first rollout.
It runs between rollouts, draws nothing from the engine's random generator and adds no steps to its counters, so the
rollouts sample exactly what they would have without it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from verl_tlt.engine.drafts.base import DraftContext
from verl_tlt.engine.sampling_params import SamplingParams
from verl_tlt.policy.decode_stats import DecodeCosts, DecodeStats

if TYPE_CHECKING:
    from verl_tlt.engine.engine import RolloutEngine

# Below this share of agreeing first drafts the reference cannot tell a broken drafter from an untrained one.
MIN_REFERENCE_RATE = 0.1
# One probe sequence: its target forward is most of the test's cost (measured on SmolLM2: docs/benchmarks.md).
PROBE_PROMPTS = 1
PROBE_POSITIONS = 16  # cut points scored per probe sequence, evenly spaced over its answer


@dataclass(frozen=True)
class ProbeScore:
    """What one probe measured: first draft tokens scored and agreeing with the target, and the probe's wall time."""

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
            f"it agreed with the target on {score.rate:.1%} of its probe draft tokens, below {min_ratio:g} x the "
            f"last passing drafter's {reference:.1%}"
        )
    return None


@torch.inference_mode()
def probe_acceptance(
    engine: RolloutEngine, sequences: Sequence[Sequence[int]], answer_starts: Sequence[int]
) -> ProbeScore:
    """Teacher-forced first-draft agreement of the engine's drafter with its target on `sequences` (prompt + answer;
    the answer of sequence i starts at answer_starts[i]). Writes scratch KV in the engine's first cache slots: call it
    with no request in flight."""
    start = time.perf_counter()
    drafter = engine.drafter
    hidden = engine.runner.prefill([list(s) for s in sequences], row_start=0)  # [N, T, H]
    contexts, wanted = [], []
    for row, (tokens, answer) in enumerate(zip(sequences, answer_starts, strict=True)):
        cuts = cut_points(answer, len(tokens))
        # The target's greedy token after each cut (its head at those positions only).
        wanted += engine.runner.logits(hidden[row, cuts]).argmax(-1).tolist()
        for cut in cuts:
            # The root is tokens[cut], which the target has not processed; the drafter consumes pairs 0..cut-1.
            states = hidden[row, :cut].clone() if drafter.uses_hidden_states else None
            contexts.append(DraftContext(list(tokens[: cut + 1]), 0, states))
    error = None
    try:
        drafted = drafter.begin(contexts).argmax(-1).tolist()
    except Exception as failure:  # a broken drafter is what the test is for
        drafted, error = [], f"{type(failure).__name__}: {failure}"
    accepted = sum(d == w for d, w in zip(drafted, wanted, strict=False))
    return ProbeScore(len(wanted), accepted, time.perf_counter() - start, error)


def cut_points(answer_start: int, length: int) -> list[int]:
    """Up to PROBE_POSITIONS roots evenly spaced over the answer (each needs one answer token before it)."""
    first, last = answer_start, length - 1
    if last < first:
        return []
    count = min(PROBE_POSITIONS, last - first + 1)
    return sorted({first + (last - first) * i // max(count - 1, 1) for i in range(count)})


def continue_greedily(engine: RolloutEngine, prompts: Sequence[Sequence[int]], tokens: int) -> list[list[int]]:
    """The prompts continued by `tokens` of the target's greedy answer, decoded plainly (no drafter, no policy; seeded,
    so the engine's random generator is not drawn from) with the engine's counters left as they were."""
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, seed=0)
    saved = engine.stats, engine.decode_costs, engine.policy
    engine.stats, engine.decode_costs, engine.policy = DecodeStats(), DecodeCosts(), None
    try:
        outputs = engine.generate(prompts, params)
    finally:
        engine.stats, engine.decode_costs, engine.policy = saved
    return [list(prompt) + output.token_ids for prompt, output in zip(prompts, outputs, strict=True)]


class DrafterSelfTest:
    """One engine's self-test: its probe prompts, the last passing rate, and counters until `take()`."""

    def __init__(self, tokens: int, min_ratio: float, max_model_len: int):
        self.tokens, self.min_ratio, self.max_model_len = tokens, min_ratio, max_model_len
        self.probes: list[list[int]] = []
        self.sequences: list[list[int]] | None = None  # the probes continued by the target (made at the first check)
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
        if self.sequences is None:
            self.sequences = continue_greedily(engine, self.probes, self.tokens)
        return self.record(probe_acceptance(engine, self.sequences, [len(p) for p in self.probes]))

    def record(self, score: ProbeScore) -> Verdict:
        """Judge `score` (however the backend measured it) against the last passing drafter's and count it; a passing
        score becomes the reference."""
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
