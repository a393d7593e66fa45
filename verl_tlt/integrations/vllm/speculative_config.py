"""The ``speculative_config`` TLT gives vLLM, built from ``tlt.speculative`` (pure: no vLLM import).

vLLM drafts chains only, so each strategy contributes its depth K. While at most ``tlt.speculative.threshold``
requests run the engine speculates; above it, K=0 (vLLM's dynamic SD schedule,
``num_speculative_tokens_per_batch_size``, whose K=0 still runs the drafter's first pass, so its KV stays in sync
and switching SD back on needs no re-prefill). The static schedule uses the deepest chain wherever the gate
speculates; the adaptive K scheduler (``k_scheduler``) refines K per batch-size bucket when vLLM allows it.

With the adaptive scheduler the schedule's values are not what runs (the policy picks each step's K), but they are
what vLLM prepares for: its V2 GPU model runner captures CUDA graphs for the K values the schedule lists (one
verification length per K), so a K the policy picks and the schedule does not list would run without a graph.
``policy_schedule`` therefore lists every chain K and 0. (vLLM's V1 runner instead downgrades verl's
FULL_AND_PIECEWISE cudagraph mode to PIECEWISE for any per-batch-size schedule: docs/vllm.md.)
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


def policy_schedule(speculative: SpeculativeConfig, max_num_seqs: int) -> list[list[int]]:
    """The schedule for an engine whose K the adaptive policy picks: every chain K in a range of its own and K=0
    above, so vLLM prepares (captures graphs for) each K the policy may choose.

    The deepest chains take the smallest batch sizes and the shallowest runs up to the threshold, the policy's usual
    preference (deeper drafts pay where fewer requests share a step); with fewer speculating batch sizes than chains
    the rest take the next batch sizes. The K=0 range starts after them, even past `max_num_seqs` (vLLM's lookup stops
    at its largest batch, but still prepares every listed K).
    """
    depths = chain_depths(speculative)
    last_sd = max(min(speculative.threshold, max_num_seqs), len(depths))
    schedule = [[size, size, k] for size, k in enumerate(depths[:-1], start=1)]
    schedule.append([len(depths), last_sd, depths[-1]])
    schedule.append([last_sd + 1, max(max_num_seqs, last_sd + 1), 0])
    return schedule


def build_speculative_config(
    speculative: SpeculativeConfig,
    drafter_dir: str,
    max_num_seqs: int,
    *,
    dynamic: bool = True,
    adaptive: bool = False,
    method: str | None = None,
) -> dict:
    """The ``speculative_config`` engine argument: the drafter at `drafter_dir` (method eagle or eagle3, as its
    export says), K up to the deepest chain.

    dynamic=False (a vLLM without the per-batch-size schedule) speculates at every batch size; the caller says so.
    adaptive: TLT's scheduler picks K per step (``policy_schedule``); else the deepest chain up to the threshold.
    method: vLLM's speculative method; None reads it from the export (``drafter_method``).
    """
    depths = chain_depths(speculative)
    method = method or drafter_method(drafter_dir)
    config: dict = {"method": method, "model": drafter_dir, "num_speculative_tokens": depths[0]}
    if dynamic:
        schedule = (
            policy_schedule(speculative, max_num_seqs)
            if adaptive
            else static_schedule(speculative, max_num_seqs, depths[0])
        )
        config["num_speculative_tokens_per_batch_size"] = schedule
    return config


def drafter_method(drafter_dir: str) -> str:
    """vLLM's speculative method for the export at `drafter_dir`: eagle3 for an EAGLE-3 drafter, else eagle."""
    import json
    from pathlib import Path

    from verl_tlt.drafter.load_eagle3 import is_eagle3_config

    config = json.loads((Path(drafter_dir) / "config.json").read_text())
    return "eagle3" if is_eagle3_config(config) else "eagle"
