"""The ``tlt`` config block: frozen dataclasses that are the single source of defaults, and the one view of the
block that every process reads it through (``tlt_view``).

Every other view of the block (the Hydra YAML files under ``verl_tlt/hydra_conf``, the table in
``docs/config_reference.md``) is generated from :class:`TLTConfig` by ``scripts/regen_config_docs.py`` and
checked against it by ``tests/test_config.py``. Loading and its error messages are ``verl_tlt.strict_config``'s.

This module is imported by every layer, so it imports nothing heavy: no verl, ray, torch or vllm.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_tlt.policy.gate import DEFAULT_BUCKETS, SpeculationGate, bucket_problem, default_buckets
from verl_tlt.strict_config import build_config, listify, to_plain

# The override prefix every key path in an error message starts with.
ROOT_KEY = "tlt"


_STRATEGY_PATTERN = re.compile(r"[1-9]\d*_[1-9]\d*_[1-9]\d*")
# The coordinator must notice drained replicas within a rollout: polling less often than this would miss the tail.
MAX_POLL_INTERVAL_S = 60.0


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
            "while decoding plainly) for a short burst; crossing modes costs a drafter catch-up, so it is rarer."
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


@dataclass(frozen=True)
class DrafterConfig:
    """The EAGLE drafter: where it starts, how it learns online (spot training) and how often replicas get it."""

    init: str = field(
        default="target",
        metadata={
            "help": "Initial drafter: target (built from the target: identity fc, a copy of its last decoder layer) or "
            "the path of an exported EAGLE drafter (verl-tlt drafter warmup output)."
        },
    )
    train: bool = field(
        default=True,
        metadata={
            "help": "Spot-train the drafter on idle rollout replicas during the long tail. false = keep the "
            "initial drafter frozen (for comparisons)."
        },
    )
    lr: float = field(default=3e-4, metadata={"help": "AdamW learning rate of the drafter."})
    max_tokens_per_batch: int = field(
        default=4096, metadata={"help": "Tokens per drafter optimizer step (packed sequences)."}
    )
    train_depth: int = field(
        default=1,
        metadata={
            "help": "Draft depths trained per step: 1 = on the target's features only (EAGLE-1/2); 2+ also trains "
            "the drafter on its own features, as its later drafts read them at inference (training-time test, as in "
            "EAGLE-3/HASS), at about that many times the cost per step."
        },
    )
    depth_decay: float = field(
        default=0.8,
        metadata={
            "help": "With train_depth 2+, depth d's loss is weighted depth_decay^(d-1) (the weights normalised to sum "
            "to 1): below 1 the first draft, which every verify step uses, counts most. In (0, 1]."
        },
    )
    hidden_loss_weight: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the feature loss (SmoothL1 between the drafter's and the target's next hidden state), "
            "EAGLE's 1.0."
        },
    )
    logit_loss_weight: float = field(
        default=0.1,
        metadata={
            "help": "Weight of the token loss (cross-entropy between the target's next-token distribution and the "
            "drafter's, both through the shared LM head), EAGLE's 0.1."
        },
    )
    grad_clip_norm: float = field(
        default=0.5,
        metadata={
            "help": "The drafter's gradients are clipped to this global norm before each optimizer step (EAGLE's 0.5, "
            "for fine-tuning online; `verl-tlt drafter warmup` starts further off and uses 5)."
        },
    )
    teacher_top_k: int = field(
        default=64,
        metadata={
            "help": "The target's next-token distribution is stored per captured token as its top-k ids and log-probs "
            "plus the rest's mass, computed once when the token is captured, so training never runs the target's LM "
            "head; the token loss scores the drafter on those k tokens and 'the rest'. 0 = the dense recipe (the "
            "target's head over every trained token at every step: exact, and several times slower)."
        },
    )
    eval_max_pairs: int = field(
        default=1024,
        metadata={
            "help": "The drafter is scored each step on this many response positions of the step's fresh captures "
            "(whole samples, evenly spaced; tlt/drafter/eval_*), before it trains on them, off the trainer's path "
            "until the step's end waits for it. Scoring runs both heads and 8 noise draws per position at depths "
            "1-4, so its cost grows with this. 0 = no per-step scores."
        },
    )
    eval_max_seconds: float = field(
        default=20.0,
        metadata={
            "help": "The per-step scores stop after this many seconds, over the samples scored so far (the online "
            "and frozen drafters on the same ones; tlt/drafter/eval_samples says how many): the step's end waits for "
            "them. A score still running after the drafter call timeout is reported late, never a reason to drop "
            "the worker. 0 = no limit."
        },
    )
    draft_vocab_size: int = field(
        default=8192,
        metadata={
            "help": "The drafter drafts over this many target tokens, the most frequent among the response tokens it "
            "trains on (EAGLE-3's reduced vocabulary; the map grows by appending as new tokens appear, up to this "
            "size); its LM head, and what drafting and training pay for it, covers only those. Verification stays "
            "over the full vocabulary, so outputs are unchanged; tlt/drafter/draft_vocab_miss says how many sampled "
            "tokens fall outside. 0 = the target's whole vocabulary."
        },
    )
    self_test_tokens: int = field(
        default=32,
        metadata={
            "help": "After every drafter load, and before the first request after a wake-up no load has tested since "
            "the last sleep, each rollout replica scores its drafter on its first served prompt and this many tokens "
            "of the target's greedy answer. Torch: teacher-forced, at up to 16 points of the answer the drafter's "
            "first draft token is compared with the target's (one target forward, one drafter call). vLLM: one "
            "greedy request of this many tokens with speculation on, scored by vLLM's accepted / drafted tokens. A "
            "drafter far below the last one that passed is refused (the previous drafter kept; after a wake-up, "
            "speculation off until the next load on torch; on vLLM the test runs before each rollout's first request, "
            "and a drafter that passed before and fails now is reloaded from its files) and counted in "
            "tlt/drafter/self_test_*. 0 = off."
        },
    )
    self_test_min_ratio: float = field(
        default=0.5,
        metadata={
            "help": "A drafter whose probe acceptance is below this fraction of the last passing drafter's is "
            "refused (only once that one accepted at least 10% of its draft tokens: below that the probe cannot "
            "tell a broken drafter from an untrained one)."
        },
    )
    memory_budget_gib: float = field(
        default=0.0,
        metadata={
            "help": "Most resident memory one drafter worker may hold, GiB. Checked before every optimizer step: over "
            "it, the burst ends at that step and the worker frees caches and drops its oldest buffered samples until "
            "under it, starting no burst until then; an out-of-memory error ends a burst the same way. Counted in "
            "tlt/drafter/memory_stops. 0 = 15% of the node's memory."
        },
    )
    input_noise: float = field(
        default=0.0,
        metadata={
            "help": "Half-width of the uniform noise added to the drafter's input hidden states in training (EAGLE's "
            "augmentation against feature drift at inference); 0 = off."
        },
    )
    buffer_tokens: int = field(
        default=262144,
        metadata={"help": "Capacity of the drafter's data buffer in tokens; the oldest samples are dropped first."},
    )
    capture_tokens: int = field(
        default=16384,
        metadata={
            "help": "Tokens of finished responses per RL step whose hidden states are captured for the drafter, "
            "split evenly over the actor's data-parallel ranks (each captures from the rows it computes; at DP 8 "
            "the default gives each rank 2048). Spent on windows of capture_window_tokens drawn with "
            "capture_tail_weight."
        },
    )
    capture_window_tokens: int = field(
        default=512,
        metadata={
            "help": "Responses are captured in windows of this many response tokens (a response's first window with "
            "its prompt), drawn across whole responses rather than as prefixes."
        },
    )
    capture_tail_weight: float = field(
        default=8.0,
        metadata={
            "help": "A response position the rollout decoded with speculation on (once at most "
            "tlt.speculative.threshold requests per replica still ran, estimated from the batch's response lengths) "
            "weighs this many times one decoded plainly when windows are drawn: the tail's late positions are what "
            "the drafter serves. 1 = uniform over response positions."
        },
    )
    sync_every: int = field(
        default=1, metadata={"help": "Push new drafter weights to the rollout replicas every this many RL steps."}
    )
    min_idle_replicas: int = field(
        default=1,
        metadata={"help": "Start spot training once this many rollout replicas have drained while others generate."},
    )
    record_dir: str = field(
        default="",
        metadata={
            "help": "Save every RL step's captured samples and the policy's shared weights to <dir>/step_NNNNN/ "
            "(JSON + safetensors), to compare drafter-training recipes offline on this run's data (verl-tlt bench "
            "drafter-replay); "
            "empty = off. Per captured token about its hidden state's size (hidden_size x 4 bytes in fp32), plus the "
            "embedding and LM head once per step."
        },
    )
    device: str = field(
        default="auto",
        metadata={
            "help": "Where each drafter worker trains: auto = on the GPU of the rollout replica whose drain starts "
            "the burst (its first GPU; the engine frees its KV cache first and has it back before the next rollout), "
            "or on the host CPU where the replica has none; cpu = always the host CPU; cuda = the replica's GPU, an "
            "error where it has none. Between bursts the drafter and its optimizer live in host memory, and scores "
            "run there."
        },
    )
    cpu_niceness: int = field(
        default=10,
        metadata={
            "help": "CPU niceness of the drafter workers' processes (0-19, higher yields more): where they share "
            "cores with the rollout replicas and verl's own processes (a CPU machine), 10 makes their training yield "
            "to those; lower trains more per idle second at some cost to the replicas still decoding."
        },
    )
    poll_interval_s: float = field(
        default=0.02,
        metadata={
            "help": "How often the coordinator checks which rollout replicas have drained, seconds (a local "
            "check of one outstanding call per replica, no RPC per check)."
        },
    )

    def __post_init__(self) -> None:
        path = f"{ROOT_KEY}.drafter"
        for key in (
            "buffer_tokens",
            "capture_tokens",
            "capture_window_tokens",
            "sync_every",
            "min_idle_replicas",
            "train_depth",
        ):
            if getattr(self, key) < 1:
                raise ValueError(f"{path}.{key} must be >= 1, got {getattr(self, key)}")
        for key, example in (
            ("teacher_top_k", 64),
            ("draft_vocab_size", 8192),
            ("eval_max_pairs", 1024),
            ("self_test_tokens", 32),
        ):
            if getattr(self, key) < 0:
                raise ValueError(
                    f"{path}.{key} must be >= 0 (0 = off), got {getattr(self, key)}; e.g. {path}.{key}={example}"
                )
        if self.max_tokens_per_batch < 2:  # a training pair spans two tokens
            raise ValueError(f"{path}.max_tokens_per_batch must be >= 2, got {self.max_tokens_per_batch}")
        if not (math.isfinite(self.grad_clip_norm) and self.grad_clip_norm > 0):
            raise ValueError(
                f"{path}.grad_clip_norm must be finite and > 0, got {self.grad_clip_norm}; "
                f"e.g. {path}.grad_clip_norm=0.5"
            )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"{path}.lr must be finite and > 0, got {self.lr}; e.g. {path}.lr=3e-4")
        if not 0 <= self.self_test_min_ratio < 1:
            raise ValueError(
                f"{path}.self_test_min_ratio must be in [0, 1), got {self.self_test_min_ratio}; e.g. "
                f"{path}.self_test_min_ratio=0.5"
            )
        if not 0 < self.depth_decay <= 1:
            raise ValueError(
                f"{path}.depth_decay must be in (0, 1], got {self.depth_decay}; e.g. {path}.depth_decay=0.8"
            )
        for key in ("hidden_loss_weight", "logit_loss_weight", "input_noise", "memory_budget_gib", "eval_max_seconds"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) >= 0):
                raise ValueError(f"{path}.{key} must be finite and >= 0, got {getattr(self, key)}")
        if not (math.isfinite(self.capture_tail_weight) and self.capture_tail_weight >= 1):
            raise ValueError(
                f"{path}.capture_tail_weight must be finite and >= 1 (1 = uniform), got {self.capture_tail_weight}; "
                f"e.g. {path}.capture_tail_weight=8"
            )
        if self.hidden_loss_weight == 0 and self.logit_loss_weight == 0:
            raise ValueError(
                f"{path}.hidden_loss_weight and {path}.logit_loss_weight are both 0, so the drafter would learn "
                f"nothing; set one above 0, e.g. {path}.hidden_loss_weight=1.0 {path}.logit_loss_weight=0.1"
            )
        if not 0 < self.poll_interval_s <= MAX_POLL_INTERVAL_S:
            raise ValueError(
                f"{path}.poll_interval_s must be in (0, {MAX_POLL_INTERVAL_S}] seconds, got {self.poll_interval_s}; "
                f"e.g. {path}.poll_interval_s=0.02"
            )
        if not 0 <= self.cpu_niceness <= 19:
            raise ValueError(
                f"{path}.cpu_niceness must be in 0..19 (a process's niceness), got {self.cpu_niceness}; e.g. "
                f"{path}.cpu_niceness=10"
            )
        if not self.init:
            raise ValueError(f"{path}.init must be 'target' or a drafter directory, got an empty string")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(
                f"{path}.device={self.device!r} is not one of ['auto', 'cpu', 'cuda']; e.g. {path}.device=auto"
            )
        if self.record_dir and not self.train:
            raise ValueError(
                f"{path}.record_dir={self.record_dir!r} records what is captured for training, and "
                f"{path}.train=false captures nothing; set {path}.train=true or drop {path}.record_dir"
            )


@dataclass(frozen=True)
class TLTConfig:
    """TLT (Taming the Long-Tail): adaptive speculative rollouts and online drafter training.

    The top-level ``tlt`` block. Frozen, so that a component cannot change a knob that another one
    already read; knob groups are nested dataclasses added with ``field(default_factory=...)``. Each
    field's ``metadata["help"]`` (knob groups included) is the comment written above its key in the YAML
    files and the meaning column of the docs table; this docstring's first line is the comment above ``tlt:``.
    """

    enabled: bool = field(
        default=False,
        metadata={
            "help": "Turn TLT (adaptive speculative rollouts + online drafter training) on. "
            "false = stock verl behaviour."
        },
    )
    speculative: SpeculativeConfig = field(
        default_factory=SpeculativeConfig,
        metadata={"help": "Adaptive speculative decoding in the rollout: threshold, buckets, strategies, bandit."},
    )
    drafter: DrafterConfig = field(
        default_factory=DrafterConfig,
        metadata={"help": "The EAGLE drafter: initial weights, online spot training, sync to the rollout replicas."},
    )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, prefix: str = ROOT_KEY) -> TLTConfig:
        """Build and validate a config from a plain dict or an OmegaConf ``DictConfig``.

        Interpolations are resolved first; a missing (``None``) block means all defaults. Unknown keys
        and wrong types raise ``ValueError`` naming the full key path (``prefix``-rooted), the value,
        why, and the override that fixes it, so a bad command line fails at start-up.
        """
        return build_config(cls, d, prefix)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict of all fields (what the YAML ``tlt:`` block holds: lists, not tuples)."""
        return dataclasses.asdict(self, dict_factory=lambda items: {k: listify(v) for k, v in items})


# ---------------------------------------------------------------- the tlt block, as each process reads it

# Where verl hands the tlt block to every rollout server: RolloutConfig.custom, filled by the tlt config groups.
ROLLOUT_TLT_KEY = f"actor_rollout_ref.rollout.custom.{ROOT_KEY}"
_VIEWS: dict[tuple[str, str], TLTConfig] = {}


def tlt_view(block: Mapping[str, Any] | None, prefix: str = ROOT_KEY) -> TLTConfig:
    """The validated TLTConfig of a ``tlt`` block (plain dict or OmegaConf node; None: defaults, TLT off).

    Every reader in a process (trainer, runtime, rollout servers, agent loops) asks here, and each distinct block
    is parsed once: the strict loader runs per block, not per caller.
    """
    plain = to_plain(block, prefix)
    key = (prefix, json.dumps(plain, sort_keys=True, default=str))
    view = _VIEWS.get(key)
    if view is None:
        view = _VIEWS[key] = TLTConfig.from_dict(plain, prefix=prefix)
    return view


def rollout_tlt_view(rollout_config: Any) -> TLTConfig:
    """The tlt block of a rollout server's config (verl's RolloutConfig or its OmegaConf node), via `tlt_view`."""
    if hasattr(rollout_config, "get"):  # an OmegaConf node or a dict
        custom = rollout_config.get("custom")
    else:  # verl's RolloutConfig dataclass
        custom = getattr(rollout_config, "custom", None)
    return tlt_view((custom or {}).get(ROOT_KEY), prefix=ROLLOUT_TLT_KEY)
