"""The torch engine's knobs and defaults, in one frozen dataclass passed whole (as nano-vllm's `Config`).

`EngineOptions` holds what a user chooses (kernels, compiling, CUDA graphs, sampling, draft room); the torch
rollout's options (integrations.torch_rollout.options) subclass it, so each field is also a key of a verl run.
`EngineConfig` adds what a deployment decides (batch size, lengths, seed, log-prob mode). Adding an engine option is
one field in `EngineOptions`: the engine, the rollout's key, its validation and the config reference
(scripts/regen_config_docs.py) follow from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from verl_tlt.engine.cpu_kernels import CPU_KERNEL_MODES

SAMPLING_MODES = ("keyed", "rejection")
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")

# The lists of choices as types, so that the strict config loader checks values and the docs list the choices.
SamplingMode = Literal[SAMPLING_MODES]
CpuKernelMode = Literal[CPU_KERNEL_MODES]
LogprobsMode = Literal[LOGPROBS_MODES]


@dataclass(frozen=True)
class EngineOptions:
    """The torch engine's user-facing options (see the module docstring)."""

    compile: bool = field(
        default=False,
        metadata={
            "help": "torch.compile the target's forward steps: faster decoding for small, overhead-bound models, "
            "but every replica first compiles each kind of step (seconds to a minute on a small CPU)."
        },
    )
    cuda_graphs: bool = field(
        default=False,
        metadata={
            "help": "Replay decode and verify forwards from CUDA graphs per (width, batch bucket) (on CUDA; ignored, "
            "with a warning, on other devices)."
        },
    )
    sampling: SamplingMode = field(
        default="keyed",
        metadata={
            "help": "How sampled rows draw tokens. keyed: Gumbel-max with noise keyed by request and position, so "
            "plain and speculative decoding emit the same tokens whatever the batch, strategy or drafter. rejection: "
            "standard speculative sampling, the same distribution with draws that depend on the steps' strategies."
        },
    )
    cpu_kernels: CpuKernelMode = field(
        default="measure",
        metadata={
            "help": "How each linear layer picks its CPU kernel. measure: timed on this host for the model's shapes "
            "at start-up and cached per host (~/.cache/verl-tlt/kernels, or $VERL_TLT_CACHE/kernels), so replicas "
            "share one measurement; thresholds: size rules measured on one AMD EPYC (fp32 only); a kernel name: "
            "that kernel everywhere it can run."
        },
    )
    cpu_layouts: bool | None = field(
        default=None,
        metadata={
            "help": "Serve CPU products from weight copies in faster kernel layouts (cpu_kernels picks them); "
            "null = on for fp32 and bf16 targets on CPU with up to 1 GiB of weights (the layouts add up to two copies)."
        },
    )
    max_draft_tokens: int = field(
        default=64,
        metadata={
            "help": "Most draft-tree nodes one row may verify in a step; each slot's KV cache keeps this much room "
            "beyond the model length for them."
        },
    )

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLING_MODES:
            self._refuse("sampling", self.sampling, f"one of {', '.join(SAMPLING_MODES)}", "keyed")
        if self.cpu_kernels not in CPU_KERNEL_MODES:
            self._refuse("cpu_kernels", self.cpu_kernels, f"one of {', '.join(CPU_KERNEL_MODES)}", "measure")
        if self.max_draft_tokens < 1:
            self._refuse("max_draft_tokens", self.max_draft_tokens, ">= 1", "64")

    def key(self, name: str) -> str:
        """How errors name option `name` (the torch rollout's options name the verl key path)."""
        return name

    def _refuse(self, name: str, value: object, wanted: str, example: str) -> None:
        raise ValueError(f"{self.key(name)} must be {wanted}, got {value!r}; e.g. {self.key(name)}={example}")


@dataclass(frozen=True)
class EngineConfig(EngineOptions):
    """Every knob of a RolloutEngine: the user's options plus what the deployment decides."""

    max_num_seqs: int = field(default=256, metadata={"help": "Requests decoded at once (continuous batching)."})
    max_model_len: int | None = field(
        default=None, metadata={"help": "Longest prompt plus response; null = the model's max_position_embeddings."}
    )
    seed: int = field(
        default=0,
        metadata={"help": "Seeds the noise keys of requests that bring no seed (and rejection sampling's draws)."},
    )
    logprobs_mode: LogprobsMode = field(
        default="processed_logprobs",
        metadata={"help": "Log-probs of the processed (temperature, top-k/p) or the raw distribution, as vLLM's."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_num_seqs < 1:
            self._refuse("max_num_seqs", self.max_num_seqs, ">= 1", "256")
        if self.max_model_len is not None and self.max_model_len < 1:
            self._refuse("max_model_len", self.max_model_len, ">= 1 or None", "4096")
        if self.logprobs_mode not in LOGPROBS_MODES:
            self._refuse(
                "logprobs_mode", self.logprobs_mode, f"one of {', '.join(LOGPROBS_MODES)}", "processed_logprobs"
            )


def with_options(config: EngineConfig, options: dict[str, Any]) -> EngineConfig:
    """`config` with the fields named in `options` replaced (RolloutEngine's keyword form); unknown names refused."""
    known = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"RolloutEngine got unknown options {unknown}; EngineConfig's fields are {sorted(known)}")
    return replace(config, **options) if options else config
