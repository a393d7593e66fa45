"""What the engine refuses before it queues or steps anything: bad prompts and strategies it cannot run.

Checked up front because a bad prompt would fail the whole batch's prefill, and a strategy too wide for the KV
cache's scratch room would fail a step with requests of other callers in it.
"""

from __future__ import annotations

from collections.abc import Sequence

from verl_tlt.spec.strategy import SpecStrategy


def check_prompt(prompt_ids: Sequence[int], max_model_len: int, vocab_size: int) -> None:
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids must not be empty")
    if len(prompt_ids) >= max_model_len:
        raise ValueError(
            f"Prompt of {len(prompt_ids)} tokens leaves no room to generate within max_model_len={max_model_len}"
        )
    if min(prompt_ids) < 0 or max(prompt_ids) >= vocab_size:
        bad = [int(t) for t in prompt_ids if not 0 <= int(t) < vocab_size]
        raise ValueError(f"Prompt token ids {bad[:5]} are outside the model's vocabulary [0, {vocab_size})")


def check_strategy(strategy: SpecStrategy, *, has_drafter: bool | None, max_draft_tokens: int, vocab_size: int) -> None:
    """has_drafter: whether the engine has a drafter, or None when one may be set later (a policy's strategies)."""
    if has_drafter is False and strategy.uses_drafter:
        raise ValueError(
            f"Speculative strategy {strategy.name!r} needs a drafter: pass drafter=... to RolloutEngine(...) or "
            "RolloutEngine.from_pretrained(...), or call engine.set_drafter(...)"
        )
    if strategy.tree_tokens > max_draft_tokens:
        raise ValueError(
            f"Speculative strategy {strategy.name!r} verifies {strategy.tree_tokens} draft tokens but the KV cache "
            f"reserves room for max_draft_tokens={max_draft_tokens}; build the engine with "
            f"max_draft_tokens>={strategy.tree_tokens} or use a smaller strategy"
        )
    if strategy.top_k > vocab_size:
        raise ValueError(f"Speculative strategy {strategy.name!r}: top_k exceeds the vocabulary ({vocab_size})")
