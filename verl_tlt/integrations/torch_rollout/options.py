"""`actor_rollout_ref.rollout.engine_kwargs.torch`: the torch rollout engine's options in a verl run.

verl hands each rollout backend its own `engine_kwargs.<name>` dict. `TorchRolloutConfig` is the engine's own
`EngineOptions` (engine.config: one field per engine option, with its default and help) plus the server's keys;
`torch_rollout_config` is the one place that reads and validates them, and `engine_config` joins them with what
verl's rollout config decides (batch size, lengths, seed, log-prob mode) into the `EngineConfig` the server passes
whole. The second table of docs/config_reference.md is generated from it by scripts/regen_config_docs.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from verl_tlt.engine.config import EngineConfig, EngineOptions
from verl_tlt.request_seeds import rollout_seed
from verl_tlt.strict_config import build_config

# Where verl users set these keys (every error message names the full path).
TORCH_ENGINE_KWARGS_KEY = "actor_rollout_ref.rollout.engine_kwargs.torch"


@dataclass(frozen=True)
class TorchServerOptions:
    """The rollout server's own keys (the engine's are EngineOptions)."""

    num_threads: int = field(
        default=1,
        metadata={
            "help": "torch intra-op threads of each rollout replica's decode thread; the replica's drafter worker "
            "(TLT) trains with as many."
        },
    )
    cpu_affinity: bool = field(
        default=True,
        metadata={
            "help": "Pin each replica's server to an equal share of its node's cores (replica i of n on c cores: "
            "cores [i*c/n, (i+1)*c/n); one shared core each where c < n), and its TLT drafter worker to the same, so "
            "a burst on a drained replica never takes a core another replica decodes on. false = the OS places them."
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


@dataclass(frozen=True)
class TorchRolloutConfig(EngineOptions, TorchServerOptions):
    """Options of verl-tlt's torch rollout engine (`actor_rollout_ref.rollout.name=torch`): the server's keys, then
    the engine's (dataclasses order the fields of the last base first)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_threads < 1:
            self._refuse("num_threads", self.num_threads, ">= 1", "1")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            self._refuse(
                "max_num_seqs", self.max_num_seqs, ">= 1 or null (= actor_rollout_ref.rollout.max_num_seqs)", "8"
            )

    def key(self, name: str) -> str:
        return f"{TORCH_ENGINE_KWARGS_KEY}.{name}"


def torch_rollout_config(rollout_config: Mapping[str, Any]) -> TorchRolloutConfig:
    """The validated `engine_kwargs.torch` of verl's rollout config (its RolloutConfig, or the OmegaConf node).

    Unknown keys and wrong types or values raise ValueError naming the key path, the value, why, and the fix.
    """
    engine_kwargs = rollout_config.get("engine_kwargs") or {}
    return build_config(TorchRolloutConfig, engine_kwargs.get("torch"), TORCH_ENGINE_KWARGS_KEY)


def engine_config(rollout_config: Any, options: TorchRolloutConfig, replica_rank: int) -> EngineConfig:
    """The EngineConfig of replica `replica_rank`: the user's engine options and what verl's rollout config decides."""
    chosen = {f.name: getattr(options, f.name) for f in fields(EngineOptions)}
    max_num_seqs = rollout_config.max_num_seqs if options.max_num_seqs is None else options.max_num_seqs
    return EngineConfig(
        **chosen,
        max_num_seqs=int(max_num_seqs),
        max_model_len=rollout_config.max_model_len or (rollout_config.prompt_length + rollout_config.response_length),
        seed=rollout_seed(rollout_config) + replica_rank,
        logprobs_mode=rollout_config.logprobs_mode or "processed_logprobs",
    )
