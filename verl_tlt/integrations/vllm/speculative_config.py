"""The ``speculative_config`` TLT gives vLLM, built from ``tlt.speculative`` (pure: no vLLM import).

vLLM drafts chains only, so each strategy contributes its depth K. While at most ``tlt.speculative.threshold``
requests run the engine speculates; above it, K=0 (vLLM's dynamic SD schedule,
``num_speculative_tokens_per_batch_size``, whose K=0 still runs the drafter's first pass, so its KV stays in sync
and switching SD back on needs no re-prefill). The static schedule uses the deepest chain wherever the gate
speculates; the adaptive K scheduler (``k_scheduler``) refines K per batch-size bucket when vLLM allows it.
"""

from __future__ import annotations

from verl_tlt.config import ROOT_KEY, SpeculativeConfig
from verl_tlt.spec.strategy import SpecStrategy

# What `tlt.speculative.strategies` means on vLLM when the user left it at its default (which has trees, the
# torch engine's strength): the chains of the same depths.
DEFAULT_VLLM_STRATEGIES = ("8_1_8", "6_1_6", "4_1_4", "2_1_2")
STRATEGIES_KEY = f"{ROOT_KEY}.speculative.strategies"


def chain_depths(speculative: SpeculativeConfig) -> tuple[int, ...]:
    """The K of every strategy, deepest first; tree strategies raise with the override that fixes them.

    The default strategy list (trees included) maps to ``DEFAULT_VLLM_STRATEGIES``: a user who sets nothing gets
    chains; one who asked for trees explicitly is told that vLLM cannot draft them.
    """
    names = speculative.strategies
    if tuple(names) == SpeculativeConfig().strategies:
        names = DEFAULT_VLLM_STRATEGIES
    trees = [name for name in names if not SpecStrategy.parse(name).is_chain]
    if trees:
        chains = sorted({SpecStrategy.parse(name).depth for name in names}, reverse=True)
        suggestion = ",".join(f'"{k}_1_{k}"' for k in chains)
        raise ValueError(
            f"{STRATEGIES_KEY}={list(names)} has tree strategies {trees}: vLLM drafts chains only (top-k 1). Fix: "
            f"{STRATEGIES_KEY}='[{suggestion}]', or serve trees with actor_rollout_ref.rollout.name=torch."
        )
    return tuple(sorted({SpecStrategy.parse(name).depth for name in names}, reverse=True))


def static_schedule(speculative: SpeculativeConfig, max_num_seqs: int, k: int) -> list[list[int]]:
    """vLLM's per-batch-size K schedule (inclusive ranges of running requests): K where the gate speculates (at
    most `threshold` requests), 0 (plain decoding) above."""
    return [
        [first, last, k if speculates else 0]
        for first, last, speculates in speculative.gate.speculative_ranges(max_num_seqs)
    ]


def build_speculative_config(
    speculative: SpeculativeConfig, drafter_dir: str, max_num_seqs: int, *, dynamic: bool = True
) -> dict:
    """The ``speculative_config`` engine argument: EAGLE-1 from `drafter_dir`, K up to the deepest chain.

    dynamic=False (a vLLM without the per-batch-size schedule) speculates at every batch size; the caller says so.
    """
    depths = chain_depths(speculative)
    config: dict = {"method": "eagle", "model": drafter_dir, "num_speculative_tokens": depths[0]}
    if dynamic:
        config["num_speculative_tokens_per_batch_size"] = static_schedule(speculative, max_num_seqs, depths[0])
    return config
