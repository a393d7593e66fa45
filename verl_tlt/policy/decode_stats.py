"""Per-engine counters of plain vs speculative decode steps (share of steps/tokens with SD, strategy mix per
batch-size bucket) and the decode cost per token by batch size (`DecodeCosts`). Each counts until `take()`, which
returns what it counted and starts afresh; the metrics over several engines' counters are metrics.decode_metrics."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from verl_tlt.policy.gate import PLAIN
from verl_tlt.spec.strategy import SpecStrategy

# Response positions the per-position acceptance is reported by: where in its response a verified row stood. Captures
# weighted toward the speculating tail (drafter.capture) should show in the late buckets.
POSITION_EDGES = (256, 1024, 4096, 16384)


def position_bucket(position: int) -> str:
    """The label of the bucket of response position `position` ('0-255', ..., '16384+')."""
    lower = 0
    for edge in POSITION_EDGES:
        if position < edge:
            return f"{lower}-{edge - 1}"
        lower = edge
    return f"{lower}+"


@dataclass
class DecodeStats:
    steps_plain: int = 0
    steps_sd: int = 0
    tokens_plain: int = 0
    tokens_sd: int = 0
    seconds_plain: float = 0.0
    seconds_sd: float = 0.0
    drafter_failures: int = 0
    # bucket label -> strategy name ('plain' included) -> decode steps
    strategy_histogram: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    # strategy name -> rows verified, and tokens they committed: acceptance length per strategy, so that drafters
    # can be compared at one strategy whatever mix of strategies a policy chose
    sd_rows_by_strategy: Counter = field(default_factory=Counter)
    sd_tokens_by_strategy: Counter = field(default_factory=Counter)
    # draft source ('eagle', 'suffix') -> draft tokens verified, and draft tokens accepted (each a target step saved)
    drafted_by_source: Counter = field(default_factory=Counter)
    accepted_by_source: Counter = field(default_factory=Counter)
    # response-position bucket (`position_bucket`) -> rows verified there, and tokens they committed
    sd_rows_by_position: Counter = field(default_factory=Counter)
    sd_tokens_by_position: Counter = field(default_factory=Counter)

    def record(self, strategy: SpecStrategy | None, batch_size: int, tokens: int, seconds: float, gate=None) -> None:
        """gate: what labels the step's bucket (a policy or a `SpeculationGate`; None: one label, 'all')."""
        if strategy is None:
            self.steps_plain += 1
            self.tokens_plain += tokens
            self.seconds_plain += seconds
        else:
            self.steps_sd += 1
            self.tokens_sd += tokens
            self.seconds_sd += seconds
            self.sd_rows_by_strategy[strategy.name] += batch_size
            self.sd_tokens_by_strategy[strategy.name] += tokens
        bucket = gate.bucket_of(batch_size) if gate is not None else None
        label = f"bs>={bucket}" if bucket is not None else ("above_threshold" if gate is not None else "all")
        self.strategy_histogram[label][PLAIN if strategy is None else strategy.name] += 1

    def record_sources(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        """One speculative step's draft tokens verified and accepted per source (see
        engine.speculative_step.draft_sources)."""
        self.drafted_by_source.update(drafted)
        self.accepted_by_source.update(accepted)

    def record_positions(self, positions: list[int], committed: list[int]) -> None:
        """One speculative step's rows: each row's response position before the step, and tokens it committed."""
        for position, tokens in zip(positions, committed, strict=True):
            bucket = position_bucket(position)
            self.sd_rows_by_position[bucket] += 1
            self.sd_tokens_by_position[bucket] += tokens

    @property
    def sd_step_share(self) -> float:
        total = self.steps_plain + self.steps_sd
        return self.steps_sd / total if total else 0.0

    @property
    def sd_token_share(self) -> float:
        total = self.tokens_plain + self.tokens_sd
        return self.tokens_sd / total if total else 0.0

    def as_dict(self) -> dict:
        return {
            "steps_plain": self.steps_plain,
            "steps_sd": self.steps_sd,
            "tokens_plain": self.tokens_plain,
            "tokens_sd": self.tokens_sd,
            "seconds_plain": self.seconds_plain,
            "seconds_sd": self.seconds_sd,
            "drafter_failures": self.drafter_failures,
            "sd_step_share": self.sd_step_share,
            "sd_token_share": self.sd_token_share,
            "strategy_histogram": {k: dict(v) for k, v in self.strategy_histogram.items()},
            "sd_rows_by_strategy": dict(self.sd_rows_by_strategy),
            "sd_tokens_by_strategy": dict(self.sd_tokens_by_strategy),
            "drafted_by_source": dict(self.drafted_by_source),
            "accepted_by_source": dict(self.accepted_by_source),
            "sd_rows_by_position": dict(self.sd_rows_by_position),
            "sd_tokens_by_position": dict(self.sd_tokens_by_position),
        }

    def acceptance_by_strategy(self) -> dict[str, float]:
        """Tokens committed per verified row, per strategy (rows ending inside a draft commit fewer); over several
        engines: metrics.decode_metrics.strategy_acceptance."""
        rows = self.sd_rows_by_strategy
        return {name: self.sd_tokens_by_strategy[name] / count for name, count in rows.items() if count}

    def take(self) -> dict:
        """The counters so far (`as_dict()`), and start afresh: the one way every decode counter is read and reset."""
        taken = self.as_dict()
        vars(self).update(vars(DecodeStats()))
        return taken


def batch_group(batch_size: int) -> int:
    """The power of two at or below batch_size: the batch-size groups decode costs are reported by."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return 1 << (batch_size.bit_length() - 1)


@dataclass
class DecodeCosts:
    """Committed tokens, seconds and steps of decode steps per batch-size group and arm ('plain' or a strategy
    name), until `take()`.

    The same groups whether or not a policy runs, so a run without speculation and one with it can be compared at
    each batch size, and within a speculating run its plain steps (probes, steps above the threshold) against its
    speculative ones at the same batch sizes and the same moments: on a machine whose speed drifts between runs, that
    within-run comparison is the one that says whether speculation paid.
    """

    # batch group -> arm -> [committed tokens, seconds, steps]
    costs: dict[int, dict[str, list[float]]] = field(default_factory=dict)

    def record(self, arm: str, batch_size: int, tokens: int, seconds: float) -> None:
        entry = self.costs.setdefault(batch_group(batch_size), {}).setdefault(arm, [0, 0.0, 0])
        entry[0] += tokens
        entry[1] += seconds
        entry[2] += 1

    def take(self) -> dict[str, dict[str, list[float]]]:
        """The costs so far as JSON-ready {group: {arm: [tokens, seconds, steps]}}; starts afresh."""
        taken = {str(group): {arm: list(entry) for arm, entry in arms.items()} for group, arms in self.costs.items()}
        self.costs = {}
        return taken
