"""A speculative-decoding strategy: where drafts come from, how deep and how wide, and how many tokens to verify."""

from __future__ import annotations

from dataclasses import dataclass

# Draft sources. eagle: the draft model (any `Drafter`). suffix: model-free drafts from the text of a request's group
# (its own tokens, its siblings' answers, the prompt's earlier answers). mixed: suffix drafts where a row's match is
# long enough, the draft model for the other rows and for the levels after a suffix draft ends (chains only).
EAGLE, SUFFIX, MIXED = "eagle", "suffix", "mixed"
SOURCES = (EAGLE, SUFFIX, MIXED)


@dataclass(frozen=True)
class SpecStrategy:
    """EAGLE-2 style draft shape (the paper's Draft_Depth / topK / Tokens_to_Verify) and its draft source.

    depth: draft levels (the longest path that can be accepted). top_k: children expanded per node; 1 means a
    chain, drafted by sampling from the drafter (or its argmax when greedy). tree_tokens: draft tokens verified in
    one target forward, not counting the root (the last committed token); a chain verifies exactly `depth`.
    source: EAGLE (the draft model), SUFFIX or MIXED (see SOURCES). Named 'depth_topk_treetokens' for the draft model
    and 'source:depth_topk_treetokens' otherwise.
    """

    depth: int
    top_k: int = 1
    tree_tokens: int | None = None
    source: str = EAGLE

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"SpecStrategy.depth must be >= 1, got {self.depth}")
        if self.top_k < 1:
            raise ValueError(f"SpecStrategy.top_k must be >= 1 (1 = chain), got {self.top_k}")
        if self.source not in SOURCES:
            raise ValueError(f"SpecStrategy.source must be one of {SOURCES}, got {self.source!r}")
        if self.source == MIXED and self.top_k != 1:
            raise ValueError(
                f"Mixed drafts are chains (a suffix draft continued by the draft model), got top_k={self.top_k}; "
                f"use e.g. 'mixed:{self.depth}_1_{self.depth}', or 'suffix:...' for suffix trees"
            )
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
    def uses_drafter(self) -> bool:
        """Whether steps of this strategy may run the draft model (suffix drafts never do)."""
        return self.source != SUFFIX

    @property
    def uses_group_drafts(self) -> bool:
        return self.source != EAGLE

    @property
    def max_candidates(self) -> int:
        """Nodes an EAGLE-2 search creates: top_k at depth 1, then top_k * top_k per further level."""
        return self.depth if self.is_chain else self.top_k + (self.depth - 1) * self.top_k * self.top_k

    @property
    def shape(self) -> str:
        """'depth_topk_treetokens', the reference implementation's strategy string (without the source)."""
        return f"{self.depth}_{self.top_k}_{self.tree_tokens}"

    @property
    def name(self) -> str:
        """The shape for the draft model, 'source:shape' for the other sources."""
        return self.shape if self.source == EAGLE else f"{self.source}:{self.shape}"

    @classmethod
    def parse(cls, value: str | SpecStrategy) -> SpecStrategy:
        """Accept a SpecStrategy or a '[source:]depth_topk_treetokens' string such as '6_4_16', '4_1_4' (a chain of 4
        from the draft model) or 'suffix:8_1_8'."""
        if isinstance(value, SpecStrategy):
            return value
        source, _, shape = str(value).rpartition(":")
        parts = shape.split("_")
        if len(parts) != 3 or not all(p.isdigit() for p in parts) or (source and source not in SOURCES):
            raise ValueError(
                f"Speculative strategy {value!r} is not '[source:]depth_topk_treetokens' (e.g. '6_4_16', '4_1_4' for "
                f"a chain of 4, 'suffix:8_1_8' for group drafts; sources: {', '.join(SOURCES)})"
            )
        depth, top_k, tree_tokens = (int(p) for p in parts)
        return cls(depth=depth, top_k=top_k, tree_tokens=tree_tokens, source=source or EAGLE)
