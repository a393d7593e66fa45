"""A long-tail rollout replayed from recorded step costs: decode policies compared without the machine's noise.

`bench adaptive` times real rollouts, and on a shared machine whole runs drift by more than the differences between
policies (the same fixed strategy has measured 1.14x to 1.48x of plain between runs of one command). Here a policy
decodes a simulated rollout instead: the simulator's replica (`verl_tlt.sim.rollout.simulate_replica`) with a step
model that draws from a recording (`RecordedSteps`). Requests with the recorded response lengths start together;
every decode step asks the policy for a strategy at the running batch size (plain above its threshold) and draws
that step's seconds and committed tokens per row from the steps recorded for that strategy at the nearest recorded
batch size. The recording (`StepCosts`) comes from the real engine decoding the same rollout plainly and with each
fixed strategy (`verl_tlt.bench.adaptive_bench.record_step_costs`). Draws are seeded: a policy's time depends only
on the recording and the seed, and the mean over seeds is its expected rollout time.

Modelled: the batch shrinking as requests finish (each row advances by the step's tokens per row, rounded up or
down at random to keep the mean, capped by what the row has left); the catch-up, where the first speculative step
after plain ones feeds the drafter every token it has not seen (the prompt, and each token decoded plainly since),
at a cost per token measured from the recording. Left out: prefill (the same for every policy) and how acceptance
varies between rows of one step.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from verl_tlt.config import SpeculativeConfig
from verl_tlt.files import write_json
from verl_tlt.policy import PLAIN, AdaptivePolicy, FixedBelowThreshold
from verl_tlt.progress import Progress
from verl_tlt.sim.rollout import simulate_replica


def nearest_batch_size(sizes: Iterable[int], batch_size: int) -> int:
    """The recorded batch size closest to `batch_size` (the smaller on a tie)."""
    return min(sizes, key=lambda size: (abs(size - batch_size), size))


@dataclass
class StepCosts:
    """What one rollout's decode steps cost, by strategy ('plain' included) and batch size."""

    lengths: list[int]  # decode steps each request needs (its response tokens after the one prefill emits)
    prompt_tokens: float  # mean prompt length: what the drafter catches up on for a request it has never seen
    catch_up_s_per_token: float
    # strategy -> batch size -> [(committed tokens per row, seconds)] of the recorded steps (catch-ups left out)
    steps: dict[str, dict[int, list[tuple[float, float]]]] = field(default_factory=dict)
    catch_up_samples: int = 0  # recorded catch-up steps behind catch_up_s_per_token

    def __post_init__(self) -> None:
        if not any(length > 0 for length in self.lengths):
            raise ValueError(f"a step-cost recording needs requests with decode steps, got lengths {self.lengths[:8]}")

    def draw(self, strategy: str, batch_size: int, rng: random.Random) -> tuple[float, float]:
        """One recorded step of `strategy` at the recorded batch size nearest to batch_size (smaller on a tie)."""
        by_size = self.steps.get(strategy)
        if not by_size:
            raise ValueError(f"no recorded steps for strategy {strategy!r}; recorded: {sorted(self.steps)}")
        return rng.choice(by_size[nearest_batch_size(by_size, batch_size)])

    def to_json(self, path: str | Path) -> None:
        data = {
            "lengths": self.lengths,
            "prompt_tokens": self.prompt_tokens,
            "catch_up_s_per_token": self.catch_up_s_per_token,
            "catch_up_samples": self.catch_up_samples,
            "steps": {
                name: {str(size): rows for size, rows in by_size.items()} for name, by_size in self.steps.items()
            },
        }
        write_json(path, data, indent=None)

    @classmethod
    def from_json(cls, path: str | Path) -> StepCosts:
        data = json.loads(Path(path).read_text())
        missing = {"lengths", "prompt_tokens", "catch_up_s_per_token", "steps"} - set(data)
        if missing:
            raise ValueError(
                f"{path} is not a step-cost recording (missing {sorted(missing)}); write one with "
                "`verl-tlt bench replay --save-costs PATH`"
            )
        steps = {
            name: {int(size): [tuple(step) for step in recorded] for size, recorded in by_size.items()}
            for name, by_size in data["steps"].items()
        }
        return cls(
            list(data["lengths"]),
            float(data["prompt_tokens"]),
            float(data["catch_up_s_per_token"]),
            steps,
            int(data.get("catch_up_samples", 0)),
        )


class RecordedSteps:
    """The simulator's step model (`verl_tlt.sim.rollout.StepModel`) over a recording: each step's seconds and
    tokens per row are drawn from the recorded steps of the strategy the policy picks (None: always plain), plus the
    drafter's catch-up on the tokens it has not seen.

    Every row starts with the mean prompt unseen by the drafter, gains one unseen token per plain step and none after
    a speculative step, so one count serves all rows. A speculative step's tokens per row are rounded up or down at
    random per row to keep the recorded mean, and are at least one.
    """

    def __init__(self, policy, costs: StepCosts, rng: random.Random):
        self.policy, self.costs, self.rng = policy, costs, rng
        self.unseen = costs.prompt_tokens  # tokens the drafter has not consumed, per running row
        self._strategy = None

    def step(self, batch: int, kv_tokens: int = 0) -> tuple[float, float | list[float], str]:
        strategy = self._strategy = self.policy.select(batch) if self.policy is not None else None
        name = PLAIN if strategy is None else strategy.name
        tokens_per_row, seconds = self.costs.draw(name, batch, self.rng)
        if strategy is None:
            self.unseen += 1
            return seconds, 1.0, name
        seconds += self.costs.catch_up_s_per_token * self.unseen * batch
        self.unseen = 0.0
        whole = int(tokens_per_row)
        return (
            seconds,
            [float(max(1, whole + (self.rng.random() < tokens_per_row - whole))) for _ in range(batch)],
            name,
        )

    def observe(self, batch: int, committed: float, seconds: float) -> None:
        if self.policy is not None:
            self.policy.observe(self._strategy, batch, round(committed), seconds)


def replay(policy, costs: StepCosts, rng: random.Random) -> float:
    """Decode the recorded rollout with `policy` (select / observe, as the engine drives it; None: plain) on the
    simulator's replica, every request there from the start; return its seconds."""
    lengths = [length for length in costs.lengths if length > 0]
    timeline, _ = simulate_replica(lengths, RecordedSteps(policy, costs, rng), max_num_seqs=len(lengths))
    return timeline.drained_s


def expected_seconds(
    make_policy: Callable[[int], object | None],
    costs: StepCosts,
    seeds: int,
    warm: bool = False,
    progress: Progress | None = None,
) -> float:
    """Mean replayed seconds over `seeds` seeds (policy seed = draw seed); warm: the policy first replays one
    rollout to learn from, as the previous RL step would give it. `progress` advances by one per seed."""
    times = []
    for seed in range(seeds):
        rng, policy = random.Random(seed), make_policy(seed)
        if warm:
            replay(policy, costs, rng)
        times.append(replay(policy, costs, rng))
        if progress is not None:
            progress.advance()
    return statistics.fmean(times)


def compare(config: SpeculativeConfig, costs: StepCosts, seeds: int, progress: Progress | None = None) -> dict:
    """Plain, each fixed strategy at or below the threshold, and the adaptive policy (cold and warm) on the replay:
    expected seconds and the ratios `bench adaptive` reports. `progress` advances by one per replayed seed, of
    seeds x (len(config.strategies) + 3) in all."""

    def adaptive(seed: int) -> AdaptivePolicy:
        return AdaptivePolicy(SpeculativeConfig(**{**config.__dict__, "seed": seed}))

    seconds = {PLAIN: expected_seconds(lambda _: None, costs, seeds, progress=progress)}
    for strategy in config.strategies:
        fixed = lambda _, strategy=strategy: FixedBelowThreshold(strategy, config.threshold)  # noqa: E731
        seconds[strategy] = expected_seconds(fixed, costs, seeds, progress=progress)
    seconds["adaptive_cold"] = expected_seconds(adaptive, costs, seeds, progress=progress)
    seconds["adaptive"] = expected_seconds(adaptive, costs, seeds, warm=True, progress=progress)
    best_fixed = min(config.strategies, key=lambda strategy: seconds[strategy])
    return {
        "seconds": {name: round(value, 4) for name, value in seconds.items()},
        "best_fixed_strategy": best_fixed,
        "adaptive_vs_best_fixed": round(seconds[best_fixed] / seconds["adaptive"], 3),
        "adaptive_vs_plain": round(seconds[PLAIN] / seconds["adaptive"], 3),
        "adaptive_cold_vs_plain": round(seconds[PLAIN] / seconds["adaptive_cold"], 3),
        "fixed_vs_plain": {strategy: round(seconds[PLAIN] / seconds[strategy], 3) for strategy in config.strategies},
    }
