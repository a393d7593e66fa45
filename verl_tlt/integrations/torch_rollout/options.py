"""`actor_rollout_ref.rollout.engine_kwargs.torch`: the torch rollout engine's options in a verl run.

verl hands each rollout backend its own `engine_kwargs.<name>` dict; this frozen dataclass is the single source of
the torch engine's keys and defaults, and `torch_rollout_config` the one place that reads and validates them (the
rollout server and the TLT runtime both call it). The second table of docs/config_reference.md is generated from
it by scripts/regen_config_docs.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from verl_tlt.engine.cpu_kernels import CPU_KERNEL_MODES
from verl_tlt.engine.sampler import SAMPLING_MODES
from verl_tlt.strict_config import build_config

# Where verl users set these keys (every error message names the full path).
TORCH_ENGINE_KWARGS_KEY = "actor_rollout_ref.rollout.engine_kwargs.torch"

# The engine's own list of modes, as a type, so that the loader checks the value and the docs list the choices.
SamplingMode = Literal[SAMPLING_MODES]
CpuKernelMode = Literal[CPU_KERNEL_MODES]


@dataclass(frozen=True)
class TorchRolloutConfig:
    """Options of verl-tlt's torch rollout engine (`actor_rollout_ref.rollout.name=torch`)."""

    num_threads: int = field(
        default=1,
        metadata={
            "help": "torch intra-op threads of each rollout replica's decode thread; the replica's drafter worker "
            "(TLT) trains with as many."
        },
    )
    max_num_seqs: int | None = field(
        default=None,
        metadata={
            "help": "Requests one replica decodes at once (continuous batching); null = "
            "actor_rollout_ref.rollout.max_num_seqs."
        },
    )
    trace_path: str | None = field(
        default=None,
        metadata={
            "help": "Append a JSON record of every rollout of every replica to this file (arrivals, finishes, engine "
            "busy time, decode cost per token by batch size and strategy); null = off."
        },
    )
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
            "help": "Replay decode and verify forwards from CUDA graphs (on CUDA; ignored, with a warning, on other "
            "devices)."
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

    def __post_init__(self) -> None:
        if self.num_threads < 1:
            raise ValueError(
                f"{TORCH_ENGINE_KWARGS_KEY}.num_threads must be >= 1, got {self.num_threads}; e.g. "
                f"{TORCH_ENGINE_KWARGS_KEY}.num_threads=1"
            )
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(
                f"{TORCH_ENGINE_KWARGS_KEY}.max_num_seqs must be >= 1 or null (= actor_rollout_ref.rollout."
                f"max_num_seqs), got {self.max_num_seqs}"
            )
        if self.cpu_kernels not in CPU_KERNEL_MODES:
            raise ValueError(
                f"{TORCH_ENGINE_KWARGS_KEY}.cpu_kernels must be one of {list(CPU_KERNEL_MODES)}, got "
                f"{self.cpu_kernels!r}; e.g. {TORCH_ENGINE_KWARGS_KEY}.cpu_kernels=measure"
            )
        if self.sampling not in SAMPLING_MODES:
            choices = " or ".join(f"{TORCH_ENGINE_KWARGS_KEY}.sampling={mode}" for mode in SAMPLING_MODES)
            raise ValueError(
                f"{TORCH_ENGINE_KWARGS_KEY}.sampling must be one of {list(SAMPLING_MODES)}, got {self.sampling!r}; "
                f"set {choices}"
            )


def torch_rollout_config(rollout_config: Mapping[str, Any]) -> TorchRolloutConfig:
    """The validated `engine_kwargs.torch` of verl's rollout config (its RolloutConfig, or the OmegaConf node).

    Unknown keys and wrong types or values raise ValueError naming the key path, the value, why, and the fix.
    """
    engine_kwargs = rollout_config.get("engine_kwargs") or {}
    return build_config(TorchRolloutConfig, engine_kwargs.get("torch"), TORCH_ENGINE_KWARGS_KEY)
