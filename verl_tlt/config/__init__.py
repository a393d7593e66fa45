"""The ``tlt`` config block: frozen dataclasses that are the single source of defaults, and the one view of the
block that every process reads it through (``tlt_view``). Its knob groups live in ``speculative`` and ``drafter``.

Every other view of the block (the Hydra YAML files under ``verl_tlt/hydra_conf``, the table in
``docs/config_reference.md``) is generated from :class:`TLTConfig` by ``scripts/regen_config_docs.py`` and
checked against it by ``tests/test_config.py``. Loading and its error messages are ``verl_tlt.strict_config``'s.

This package is imported by every layer, so it imports nothing heavy: no verl, ray, torch or vllm.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_tlt.config.drafter import MAX_POLL_INTERVAL_S, DrafterConfig
from verl_tlt.config.root_key import ROOT_KEY
from verl_tlt.config.speculative import SpeculativeConfig
from verl_tlt.strict_config import build_config, listify, to_plain

__all__ = [
    "MAX_POLL_INTERVAL_S",
    "ROLLOUT_TLT_KEY",
    "ROOT_KEY",
    "DrafterConfig",
    "SpeculativeConfig",
    "TLTConfig",
    "rollout_tlt_view",
    "tlt_view",
]


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
