"""Response lengths of an RL step's rollout: what makes the long tail.

`GroupLengths` draws a GRPO step's lengths: each prompt gets a typical length (log-normal around `median_tokens`, its
spread `prompt_sigma` standing for how hard prompts differ), each of its `group_size` samples a length log-normal
around that (`sample_sigma`), and every length is capped at `max_tokens`, where the rollout truncates. Responses grow
as RL goes on (`growth_per_step`, a factor per step on the median), as reasoning models do under GRPO.

`TraceLengths` takes a step's lengths from a file instead: a JSON list of lists (one list per step) or verl-tlt
rollout records (`engine_kwargs.torch.trace_path`), cycling when the simulation runs more steps than the file has.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GroupLengths:
    median_tokens: float
    prompt_sigma: float
    sample_sigma: float
    max_tokens: int
    growth_per_step: float = 1.0
    min_tokens: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_tokens <= self.median_tokens <= self.max_tokens:
            raise ValueError(
                f"lengths need 1 <= min_tokens <= median_tokens <= max_tokens, got min_tokens={self.min_tokens}, "
                f"median_tokens={self.median_tokens}, max_tokens={self.max_tokens}"
            )
        if self.prompt_sigma < 0 or self.sample_sigma < 0 or self.growth_per_step <= 0:
            raise ValueError("lengths.prompt_sigma and lengths.sample_sigma must be >= 0, growth_per_step > 0")

    def step(self, step: int, prompts: int, group_size: int, rng: random.Random) -> list[int]:
        """The lengths of RL step `step` (0-based): prompts x group_size, grouped by prompt."""
        median = self.median_tokens * self.growth_per_step**step
        lengths = []
        for _ in range(prompts):
            prompt_mu = math.log(median) + rng.gauss(0.0, self.prompt_sigma)
            for _ in range(group_size):
                drawn = math.exp(prompt_mu + rng.gauss(0.0, self.sample_sigma))
                lengths.append(int(min(self.max_tokens, max(self.min_tokens, round(drawn)))))
        return lengths

    def quantile(self, q: float, step: int = 0) -> float:
        """The q-quantile of one response's length at `step` (before the cap), for describing a preset."""
        sigma = math.hypot(self.prompt_sigma, self.sample_sigma)
        z = math.sqrt(2) * _erfinv(2 * q - 1)
        return self.median_tokens * self.growth_per_step**step * math.exp(sigma * z)


@dataclass(frozen=True)
class TraceLengths:
    steps: tuple[tuple[int, ...], ...]

    @classmethod
    def from_file(cls, path: str | Path) -> TraceLengths:
        text = Path(path).read_text()
        try:
            if text.lstrip().startswith("["):
                steps = [tuple(int(n) for n in step) for step in json.loads(text)]
            else:
                by_rollout: dict[int, list[int]] = {}
                for line in text.splitlines():
                    record = json.loads(line) if line.strip() else None
                    if record and not record.get("validation"):
                        by_rollout.setdefault(record["rollout_index"], []).extend(record["response_tokens"])
                steps = [tuple(by_rollout[index]) for index in sorted(by_rollout)]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"{path}: not a length trace ({error}); give a JSON list of lists of response lengths, one list per "
                "step, or a verl-tlt rollout record file (engine_kwargs.torch.trace_path)"
            ) from None
        if not steps or not all(steps) or any(n < 1 for step in steps for n in step):
            raise ValueError(f"{path}: every step needs at least one response length, each >= 1 token")
        return cls(tuple(steps))

    def step(self, step: int, prompts: int, group_size: int, rng: random.Random) -> list[int]:
        return list(self.steps[step % len(self.steps)])


def _erfinv(y: float) -> float:
    """Inverse error function by Newton steps on math.erf (only for describing presets)."""
    x = 0.0
    for _ in range(60):
        x -= (math.erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))
    return x
