"""The `csub` task: remainder by repeated subtraction, a synthetic long-tail reasoning problem.

Why this task: TLT speeds up the long tail of RL rollouts, so the toy target needs (1) a response length
distribution with a heavy tail, like reasoning LLMs, and (2) to be learnable by a ~1M-parameter model on two
CPU cores in minutes. `csub` has both: every step depends only on the previous line and
`d`, and the number of steps is drawn from a log-normal.

Format (the tokenizer is character level and ignores spaces, so spacing here is cosmetic):

    prompt    "n : d"
    response  "n - d = n' ; n' - d = n'' ; ... ; x - d < 0 ; # x"      (x = n mod d, then <eos>)

For example "11 : 4" -> "11 - 4 = 7 ; 7 - 4 = 3 ; 3 - 4 < 0 ; # 3". A response has `num_steps` subtraction
steps plus one final step; `;` ends a step, so the response needs no newlines.

A second, compact style lists only the running values: "11 : 4" -> "11 , 7 , 3 < 4 ; # 3" (`num_steps` values
followed by `,`, then the last value, `< d ;` and the answer). It is about 2.5x shorter. Both styles are correct
solutions; a toy target that learned both (a small share of compact examples in its SFT data) lets RL with a
brevity-favouring reward (`verl_tlt.toy.reward.compute_score_concise`) shift the policy's style, which is how the
quickstart makes the policy drift away from what a frozen drafter learned.

Sampling: S = round(LogNormal(mu=ln 3.5, sigma=1.047)) clipped to [1, 96], d ~ U{2..9}, r ~ U{0..d-1},
n = S*d + r (drawn in that order from one `random.Random`). Most problems take ~3 steps, 1% take 40+.

Reward rule (`score`), for a response and the ground-truth remainder:
  - 1.0 if the response is well formed (the whole text matches either style's grammar, whitespace ignored) and its
    final answer `# x` equals the ground truth. Intermediate arithmetic is not checked: the answer is what RL
    rewards.
  - otherwise, if the problem (n, d) is known: PARTIAL_CREDIT_MAX * k / (num_steps + 1), where k is the number
    of leading steps (final step included) that match the reference solution of either style exactly. This is strictly
    increasing in k and at most PARTIAL_CREDIT_MAX (0.5), so a correct answer always beats any partial one,
    while early in training GRPO groups get different rewards instead of all zeros.
  - otherwise 0.0.

Pure Python on purpose: verl loads the reward function by file path in reward workers, so nothing here may
import torch, transformers or verl.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass

# verl data_source of this task (the parquet column; the reward function checks it).
DATA_SOURCE = "toy/csub"

STEPS_LOGNORMAL_MU = math.log(3.5)
STEPS_LOGNORMAL_SIGMA = 1.047
MIN_STEPS = 1
MAX_STEPS = 96
MIN_DIVISOR = 2
MAX_DIVISOR = 9

# Reward for a wrong or malformed answer is at most this; a correct answer gets 1.0.
PARTIAL_CREDIT_MAX = 0.5

# Solution styles: the default step-by-step one, and the compact one (running values only).
STANDARD, COMPACT = "standard", "compact"
STYLES = (STANDARD, COMPACT)

# Whitespace-free grammar of a whole response: zero or more "a-d=b;" steps, then "x-d<0;#x" (standard), or zero
# or more "a," values, then "x<d;#x" (compact).
_RESPONSE_RES = {
    STANDARD: re.compile(r"(?:\d+-\d+=\d+;)*\d+-\d+<0;#(\d+)"),
    COMPACT: re.compile(r"(?:\d+,)*\d+<\d+;#(\d+)"),
}
_PROMPT_RE = re.compile(r"(\d+):(\d+)")
_WHITESPACE_RE = re.compile(r"\s+")


@dataclass(frozen=True)
class Problem:
    """One `csub` problem: compute n mod d by subtracting d `num_steps` times."""

    n: int
    d: int
    answer: int
    num_steps: int

    def __post_init__(self) -> None:
        if self.n < 0 or self.d < 1:
            raise ValueError(f"csub needs n >= 0 and d >= 1, got n={self.n}, d={self.d}")
        if (self.answer, self.num_steps) != (self.n % self.d, self.n // self.d):
            raise ValueError(
                f"inconsistent Problem: n={self.n}, d={self.d} imply answer={self.n % self.d}, "
                f"num_steps={self.n // self.d}, got answer={self.answer}, num_steps={self.num_steps}; "
                "build problems with Problem.from_nd(n, d)"
            )

    @classmethod
    def from_nd(cls, n: int, d: int) -> Problem:
        if d < 1:
            raise ValueError(f"csub needs a divisor d >= 1, got d={d}")
        return cls(n=n, d=d, answer=n % d, num_steps=n // d)


def sample_num_steps(rng: random.Random) -> int:
    """Draw the number of subtraction steps from the clipped log-normal (the heavy tail)."""
    steps = round(rng.lognormvariate(STEPS_LOGNORMAL_MU, STEPS_LOGNORMAL_SIGMA))
    return min(max(steps, MIN_STEPS), MAX_STEPS)


def sample_problem(rng: random.Random) -> Problem:
    """Draw one problem; all randomness comes from `rng`, so a seeded `rng` reproduces it."""
    num_steps = sample_num_steps(rng)
    d = rng.randint(MIN_DIVISOR, MAX_DIVISOR)
    r = rng.randint(0, d - 1)
    return Problem.from_nd(num_steps * d + r, d)


def make_problems(num: int, seed: int) -> list[Problem]:
    """`num` problems drawn from `random.Random(seed)`; the same (num, seed) always gives the same list."""
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    rng = random.Random(seed)
    return [sample_problem(rng) for _ in range(num)]


def prompt_text(problem: Problem) -> str:
    """The user message for a problem, e.g. "11 : 4"."""
    return f"{problem.n} : {problem.d}"


def parse_prompt(text: str) -> Problem:
    """Inverse of `prompt_text` (whitespace ignored)."""
    match = _PROMPT_RE.fullmatch(_compact(text))
    if match is None:
        raise ValueError(f"not a csub prompt (expected 'n : d'): {text!r}")
    return Problem.from_nd(int(match.group(1)), int(match.group(2)))


def solution_steps(problem: Problem, style: str = STANDARD) -> list[str]:
    """The reference response as a list of steps: `num_steps` subtractions (or values), then the final step."""
    _check_style(style)
    steps = []
    value = problem.n
    for _ in range(problem.num_steps):
        steps.append(f"{value} - {problem.d} = {value - problem.d} ;" if style == STANDARD else f"{value} ,")
        value -= problem.d
    steps.append(
        f"{value} - {problem.d} < 0 ; # {value}" if style == STANDARD else f"{value} < {problem.d} ; # {value}"
    )
    return steps


def solution_text(problem: Problem, style: str = STANDARD) -> str:
    """The reference response (without <eos>) in `style`, steps separated by spaces."""
    return " ".join(solution_steps(problem, style))


def response_num_tokens(problem: Problem, style: str = STANDARD) -> int:
    """Tokens in the reference response including <eos>: one per non-space character (char-level tokenizer)."""
    return len(_compact(solution_text(problem, style))) + 1


def response_style(response_text: str) -> str | None:
    """STANDARD or COMPACT for a well-formed response, None if it matches neither grammar."""
    text = _compact(response_text)
    return next((style for style, pattern in _RESPONSE_RES.items() if pattern.fullmatch(text)), None)


def parse_answer(response_text: str) -> int | None:
    """The final answer of a well-formed response (either style), or None if the text matches neither grammar.

    Whitespace anywhere is ignored, because the tokenizer drops it when encoding and may add it when decoding.
    """
    text = _compact(response_text)
    for pattern in _RESPONSE_RES.values():
        match = pattern.fullmatch(text)
        if match:
            return int(match.group(1))
    return None


def score(response_text: str, ground_truth: str | int, problem: Problem | None = None) -> float:
    """Reward in [0, 1] for a response; the rule is in the module docstring."""
    expected = _parse_ground_truth(ground_truth)
    if problem is not None and problem.answer != expected:
        raise ValueError(f"ground_truth {ground_truth!r} is not the answer of {problem}")
    if parse_answer(response_text) == expected:
        return 1.0
    if problem is None:
        return 0.0
    return PARTIAL_CREDIT_MAX * num_correct_leading_steps(response_text, problem) / (problem.num_steps + 1)


def num_correct_leading_steps(response_text: str, problem: Problem) -> int:
    """How many reference steps, from the first, the response reproduces exactly (whitespace ignored), in
    whichever style it matches best."""
    response = _compact(response_text)
    best = 0
    for style in STYLES:
        num_correct, offset = 0, 0
        for step in solution_steps(problem, style):
            step = _compact(step)
            if not response.startswith(step, offset):
                break
            num_correct += 1
            offset += len(step)
        best = max(best, num_correct)
    return best


def length_stats(problems: Iterable[Problem]) -> dict[str, dict[str, float]]:
    """Nearest-rank p50/p90/p99/max (and mean) of steps and of response tokens (with <eos>) over `problems`."""
    problems = list(problems)
    if not problems:
        raise ValueError("length_stats needs at least one problem")
    return {
        "steps": _summary([p.num_steps for p in problems]),
        "response_tokens": _summary([response_num_tokens(p) for p in problems]),
    }


def _summary(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)
    # Nearest rank: the smallest value with at least p% of the sample at or below it.
    summary: dict[str, float] = {f"p{p}": ordered[max(math.ceil(p / 100 * len(ordered)) - 1, 0)] for p in (50, 90, 99)}
    summary["max"] = ordered[-1]
    summary["mean"] = sum(ordered) / len(ordered)
    return summary


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"unknown csub solution style {style!r}; use one of {STYLES}")


def _parse_ground_truth(ground_truth: str | int) -> int:
    try:
        return int(str(ground_truth).strip())
    except ValueError:
        raise ValueError(f"csub ground_truth must be an integer remainder, got {ground_truth!r}") from None


def _compact(text: str) -> str:
    return _WHITESPACE_RE.sub("", text)
