"""A speculative-decoding strategy: how deep and how wide to draft, and how many draft tokens to verify."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecStrategy:
    """EAGLE-2 style draft shape (the paper's Draft_Depth / topK / Tokens_to_Verify).

    depth: draft levels (the longest path that can be accepted). top_k: children expanded per node; 1 means a
    chain, drafted by sampling from the drafter (or its argmax when greedy). tree_tokens: draft tokens verified in
    one target forward, not counting the root (the last committed token); a chain verifies exactly `depth`.
    """

    depth: int
    top_k: int = 1
    tree_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"SpecStrategy.depth must be >= 1, got {self.depth}")
        if self.top_k < 1:
            raise ValueError(f"SpecStrategy.top_k must be >= 1 (1 = chain), got {self.top_k}")
        tree_tokens = self.depth if self.tree_tokens is None else self.tree_tokens
        if self.top_k == 1 and tree_tokens != self.depth:
            raise ValueError(
                f"A chain (top_k=1) verifies exactly depth={self.depth} tokens, got tree_tokens={tree_tokens}; "
                f"drop tree_tokens or set it to {self.depth}"
            )
        most = self.max_candidates
        if not 1 <= tree_tokens <= most:
            raise ValueError(
                f"SpecStrategy tree_tokens must be in [1, {most}] for depth={self.depth}, top_k={self.top_k} "
                f"(that is every node the tree search creates), got {tree_tokens}"
            )
        object.__setattr__(self, "tree_tokens", tree_tokens)

    @property
    def is_chain(self) -> bool:
        return self.top_k == 1

    @property
    def max_candidates(self) -> int:
        """Nodes an EAGLE-2 search creates: top_k at depth 1, then top_k * top_k per further level."""
        return self.depth if self.is_chain else self.top_k + (self.depth - 1) * self.top_k * self.top_k

    @property
    def name(self) -> str:
        """'depth_topk_treetokens', the reference implementation's strategy string."""
        return f"{self.depth}_{self.top_k}_{self.tree_tokens}"

    @classmethod
    def parse(cls, value: str | SpecStrategy) -> SpecStrategy:
        """Accept a SpecStrategy or a 'depth_topk_treetokens' string such as '6_4_16' or '4_1_4'."""
        if isinstance(value, SpecStrategy):
            return value
        parts = str(value).split("_")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(
                f"Speculative strategy {value!r} is not 'depth_topk_treetokens' (e.g. '6_4_16', or '4_1_4' for a "
                "chain of 4)"
            )
        depth, top_k, tree_tokens = (int(p) for p in parts)
        return cls(depth=depth, top_k=top_k, tree_tokens=tree_tokens)
