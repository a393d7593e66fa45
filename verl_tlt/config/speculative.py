"""``tlt.speculative``: when the rollout speculates and with which strategies (the adaptive policy, BEG-MAB)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from verl_tlt.config.root_key import ROOT_KEY
from verl_tlt.policy.gate import DEFAULT_BUCKETS, SpeculationGate, bucket_problem, default_buckets

_STRATEGY_PATTERN = re.compile(r"[1-9]\d*_[1-9]\d*_[1-9]\d*")


@dataclass(frozen=True)
class SpeculativeConfig:
    """When the rollout speculates and with which strategies (the adaptive policy, BEG-MAB)."""

    threshold: int = field(
        default=32, metadata={"help": "Speculate only while a rollout engine runs at most this many requests."}
    )
    buckets: tuple[int, ...] = field(
        default=DEFAULT_BUCKETS,
        metadata={
            "help": "Lower bounds of the batch-size buckets, ascending from 1; each bucket learns its own best "
            "strategy (the default keeps its bounds up to threshold). Fine at small sizes, where the SD speedup "
            "changes fastest with the batch and the tail spends most of its steps: arms are compared on steps of one "
            "bucket, and wide buckets mix sizes whose best arms differ (verl-tlt bench replay shows the effect)."
        },
    )
    strategies: tuple[str, ...] = field(
        default=("8_4_16", "6_4_8", "4_1_4", "2_1_2"),
        metadata={
            "help": "Candidate SD strategies, depth_topk_treetokens (top-k 1 = a chain); each is an arm in every "
            "bucket."
        },
    )
    plain_arm_min_batch: int = field(
        default=1,
        metadata={
            "help": "Buckets starting at this batch size or above also have plain decoding as an arm (1 = every "
            "bucket, so the policy can learn where SD does not pay, even at batch 1)."
        },
    )
    epsilon: float = field(
        default=0.1,
        metadata={
            "help": "Exploration rate of the epsilon-greedy bandits among the arms of the current mode (the SD "
            "strategies while speculating; switching between them is free) whose rate is within 10% of the best; "
            "an arm further behind is replayed only after sitting out 4 windows of its bucket's steps (a wait that "
            "doubles, up to 4x, while it stays behind)."
        },
    )
    probe_rate: float = field(
        default=0.02,
        metadata={
            "help": "Chance per decode step to probe the other mode (plain while speculating, a random SD strategy "
            "while decoding plainly) for a short burst; crossing modes costs a drafter catch-up, so it is rarer. Where "
            "no drafter arm is predicted to pay, each probe halves the next one's chance, down to 1/16 of this, until "
            "one is."
        },
    )
    window: int = field(
        default=32,
        metadata={
            "help": "Latest steps per arm whose rate (committed tokens per request-second, slowest tenth left out) "
            "ranks it."
        },
    )
    min_samples: int = field(default=2, metadata={"help": "Plays of every arm before the bandit exploits."})
    min_dwell_steps: int = field(
        default=4, metadata={"help": "Decode steps between switches of plain <-> speculative (hysteresis)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the bandits' exploration."})
    vllm_catch_up_window: int = field(
        default=64,
        metadata={
            "help": "vLLM rollout: on steps that draft nothing (K=0) the drafter does not run; each request's target "
            "hidden states are kept for up to this many positions and the drafter catches up on them in one pass "
            "when it next drafts (or when the window fills). 0 = vLLM's own behaviour: the drafter's first pass "
            "every step."
        },
    )
    group_drafts: bool = field(
        default=False,
        metadata={
            "help": "Also draft without a model, from the text of each request's GRPO group: its own tokens, its "
            "siblings' answers (finished and in progress) and the prompt's answers from earlier steps. Adds "
            "group_strategies as arms of every bucket, so the bandit learns when they pay (torch rollout only)."
        },
    )
    group_strategies: tuple[str, ...] = field(
        default=("suffix:8_1_8", "mixed:4_1_4"),
        metadata={
            "help": "Arms added by group_drafts, source:depth_topk_treetokens. suffix: drafts from the group's text "
            "only (no drafter compute; top-k > 1 proposes the most frequent continuations as a tree); mixed (chains): "
            "suffix drafts where a row's match is long enough, continued (or replaced) by the drafter."
        },
    )
    suffix_min_match: int = field(
        default=3,
        metadata={
            "help": "Shortest suffix of a request's tokens that must occur in its group's text for a suffix draft; "
            "mixed drafts use the drafter for rows with a shorter match."
        },
    )
    suffix_history_tokens: int = field(
        default=1_000_000,
        metadata={
            "help": "Tokens of earlier answers kept per rollout engine, by prompt, as drafts for the prompt's next "
            "groups (oldest evicted; 0 = siblings only)."
        },
    )

    def __post_init__(self) -> None:
        path = f"{ROOT_KEY}.speculative"
        for key in ("threshold", "window", "min_samples"):
            if getattr(self, key) < 1:
                raise ValueError(f"{path}.{key} must be >= 1, got {getattr(self, key)}; e.g. {path}.{key}=32")
        if self.vllm_catch_up_window < 0:
            raise ValueError(
                f"{path}.vllm_catch_up_window must be >= 0 (0 = off), got {self.vllm_catch_up_window}; "
                f"e.g. {path}.vllm_catch_up_window=64"
            )
        if self.min_dwell_steps < 0:
            raise ValueError(f"{path}.min_dwell_steps must be >= 0, got {self.min_dwell_steps}")
        for key, example in (("epsilon", 0.1), ("probe_rate", 0.02)):
            value = getattr(self, key)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{path}.{key} must be in [0, 1], got {value}; e.g. {path}.{key}={example}")
        if tuple(self.buckets) == DEFAULT_BUCKETS:  # the default adapts to a lower threshold; explicit lists do not
            object.__setattr__(self, "buckets", default_buckets(self.threshold))
        if bucket_problem(self.buckets, self.threshold):
            raise ValueError(
                f"{path}.buckets must ascend strictly from 1 and stay <= {path}.threshold={self.threshold}, "
                f"got {list(self.buckets)}; e.g. {path}.buckets=[1,2,4,8,16]"
            )
        bad = [name for name in self.strategies if not _STRATEGY_PATTERN.fullmatch(str(name))]
        if not self.strategies or bad:
            raise ValueError(
                f"{path}.strategies must be a non-empty list of depth_topk_treetokens strings, got "
                f'{list(self.strategies)} (bad: {bad}); e.g. {path}.strategies=\'["8_4_16","4_1_4"]\' (quoted: '
                "Hydra reads an unquoted 4_1_4 as the integer 414)"
            )
        from verl_tlt.spec.strategy import SpecStrategy  # pure dataclass, no torch: keeps this module light

        for name in self.strategies:  # well-formed, but a shape the tree search cannot make (e.g. 4_1_8)
            try:
                SpecStrategy.parse(name)
            except ValueError as error:
                raise ValueError(f"{path}.strategies: {name!r} is not a usable strategy: {error}") from error
        self._check_group_drafts(path)

    def _check_group_drafts(self, path: str) -> None:
        from verl_tlt.spec.strategy import EAGLE, SpecStrategy

        if self.suffix_min_match < 1:
            raise ValueError(
                f"{path}.suffix_min_match must be >= 1, got {self.suffix_min_match}; e.g. {path}.suffix_min_match=3"
            )
        if self.suffix_history_tokens < 0:
            raise ValueError(
                f"{path}.suffix_history_tokens must be >= 0 (0 = siblings only), got {self.suffix_history_tokens}"
            )
        for name in self.group_strategies:
            try:
                strategy = SpecStrategy.parse(name)
            except ValueError as error:
                raise ValueError(f"{path}.group_strategies: {name!r} is not a usable strategy: {error}") from error
            if strategy.source == EAGLE:
                raise ValueError(
                    f"{path}.group_strategies: {name!r} drafts with the drafter; group strategies name their source, "
                    f"e.g. 'suffix:{name}' or 'mixed:{name}' (drafter strategies belong in {path}.strategies)"
                )
        if self.group_drafts and not self.group_strategies:
            raise ValueError(
                f"{path}.group_drafts=true needs at least one of {path}.group_strategies, got none; e.g. "
                f"{path}.group_strategies='[\"suffix:8_1_8\"]'"
            )

    @property
    def gate(self) -> SpeculationGate:
        """Where this block lets a rollout speculate, and its buckets (the one threshold comparison)."""
        return SpeculationGate(self.threshold, self.buckets)

    @property
    def arm_strategies(self) -> tuple[str, ...]:
        """The strategies the adaptive policy plays: the drafter's, then the group strategies when group_drafts is
        on."""
        return tuple(self.strategies) + (tuple(self.group_strategies) if self.group_drafts else ())
