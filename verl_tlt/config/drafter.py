"""``tlt.drafter``: the EAGLE drafter, where it starts, how it learns online (spot training) and where it trains."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from verl_tlt.config.root_key import ROOT_KEY

# The coordinator must notice drained replicas within a rollout: polling less often than this would miss the tail.
MAX_POLL_INTERVAL_S = 60.0


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
    family: str = field(
        default="eagle",
        metadata={
            "help": "Drafter family. eagle: EAGLE-1/2 (reads the target's final hidden state, drafts with the "
            "target's head rows). eagle3: EAGLE-3 (fuses the target's layers 2, L/2 and L-3, drafts with its own "
            "trained head over the draft vocabulary, served by vLLM as method eagle3; trains on the token loss alone, "
            "so hidden_loss_weight does not apply, and needs teacher_top_k > 0 and draft_vocab_size > 0)."
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
        default=0,
        metadata={
            "help": "Draft depths trained per step: 1 = on the target's features only (EAGLE-1/2); 2+ also trains "
            "the drafter on its own features, as its later drafts read them at inference (training-time test, as in "
            "EAGLE-3/HASS), at about that many times the cost per step. 0 = the family's recipe: 1 for eagle, 3 for "
            "eagle3 (the EAGLE-3 reference unrolls 7; 3 keeps a step at about 3x the cost)."
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
        default=256,
        metadata={
            "help": "The drafter is scored on this many response positions of each step's fresh captures (whole "
            "samples, evenly spaced, at most half of the step's; tlt/drafter/eval_*). They are held out of training "
            "until scored; spot-training bursts score them a group at a time between their optimizer steps, on a "
            "drained replica, never while the RL step waits. Both heads and 8 noise draws per position at depths "
            "1-4: about 13 s for 256 positions at a 49k vocabulary on one CPU core. 0 = no scores."
        },
    )
    eval_max_seconds: float = field(
        default=20.0,
        metadata={
            "help": "A burst's score stops after this many seconds (checked every 512 tokens), over the samples "
            "scored so far (the online and frozen drafters on the same ones; tlt/drafter/eval_samples says how "
            "many), and sooner when the rollout ends. 0 = no limit."
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
        metadata={
            "help": "Capacity of the drafter's data buffer in tokens; the oldest samples are dropped first. A budget "
            "of memory: an EAGLE-3 sample keeps three layers per token, so it holds a third of these tokens."
        },
    )
    capture_tokens: int = field(
        default=16384,
        metadata={
            "help": "Tokens of finished responses per RL step whose hidden states are captured for the drafter, "
            "split evenly over the actor's data-parallel ranks (each captures from the rows it computes; at DP 8 "
            "the default gives each rank 2048). Spent on windows of capture_window_tokens drawn with "
            "capture_tail_weight. A budget of memory: EAGLE-3 captures the final state and three layers per token, so "
            "it takes a quarter of these tokens."
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
    cpu_idle_class: bool = field(
        default=True,
        metadata={
            "help": "On a CPU machine (Linux), run the drafter workers under the idle scheduling class (SCHED_IDLE): "
            "they get a core only when nothing else wants it, and the kernel places woken processes (verl's agent "
            "loop, Ray) on a core that runs only such work as if it were free, so a burst on a drained replica's core "
            "does not push them onto the core a replica still decodes on. Stronger than cpu_niceness; false = "
            "niceness only."
        },
    )
    poll_interval_s: float = field(
        default=0.02,
        metadata={
            "help": "How often the coordinator checks which rollout replicas have drained, seconds (a local "
            "check of one outstanding call per replica, no RPC per check)."
        },
    )

    @property
    def unroll_depth(self) -> int:
        """Draft depths trained per step: train_depth, or the family's recipe where it is 0."""
        if self.train_depth:
            return self.train_depth
        return 3 if self.family == "eagle3" else 1

    def __post_init__(self) -> None:
        path = f"{ROOT_KEY}.drafter"
        for key in (
            "buffer_tokens",
            "capture_tokens",
            "capture_window_tokens",
            "sync_every",
            "min_idle_replicas",
        ):
            if getattr(self, key) < 1:
                raise ValueError(f"{path}.{key} must be >= 1, got {getattr(self, key)}")
        for key, example in (
            ("train_depth", 3),
            ("teacher_top_k", 64),
            ("draft_vocab_size", 8192),
            ("eval_max_pairs", 256),
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
        self._check_family(path)
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

    def _check_family(self, path: str) -> None:
        if self.family not in ("eagle", "eagle3"):
            raise ValueError(
                f"{path}.family={self.family!r} is not one of ['eagle', 'eagle3']; e.g. {path}.family=eagle3"
            )
        if self.family != "eagle3":
            return
        for key, example, why in (
            ("teacher_top_k", 64, "its samples keep only the fused layers, so the target's labels are taken once"),
            ("draft_vocab_size", 8192, "its own head covers the draft vocabulary"),
            ("logit_loss_weight", 0.1, "it trains on the token loss alone"),
        ):
            if getattr(self, key) <= 0:
                raise ValueError(
                    f"{path}.family=eagle3 needs {path}.{key} > 0 ({why}), got {getattr(self, key)}; e.g. "
                    f"{path}.{key}={example}"
                )
