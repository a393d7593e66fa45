"""The interface a draft model implements so the engine can speculate with it.

The engine owns the running batch: row b of every call is cache slot b. Before each speculative step it calls
`begin` with what changed since the drafter last saw each row; the drafter returns its next-token logits after
each row's last committed token (the tree's root), then the tree search calls `expand` level by level (see
`verl_tlt.spec.tree`). Drafters keep whatever state they like per slot (an EAGLE head keeps a KV cache) and
follow the engine's slot compaction through `move_slot`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from verl_tlt.spec.tree import chain_from_expand


@dataclass
class DraftContext:
    """One running row as the drafter needs it.

    token_ids: the committed sequence (prompt + output); its last token is the root, which the target has not
    processed yet. num_synced: how many leading positions this drafter has already consumed for this row (0 for a
    new request in the slot). hidden_states: [len(token_ids) - 1 - num_synced, H] target last-layer hidden states
    of positions [num_synced, len(token_ids) - 1) (followed by the drafter's `feature_layers`, if any), present
    only when the drafter sets `uses_hidden_states`.
    """

    token_ids: list[int]
    num_synced: int
    hidden_states: torch.Tensor | None = None


class Drafter(ABC):
    """A draft model for speculative decoding in the torch engine."""

    #: Ask the engine to record the target's last-layer hidden states for `begin` (EAGLE-style drafters).
    uses_hidden_states: bool = False
    #: Residual-stream states (after that many target layers) the drafter also reads (EAGLE-3): the engine's target
    #: then appends them to its hidden states (`CausalLM.feature_layers`), and `begin` gets [.., (1 + n) * H].
    feature_layers: tuple[int, ...] = ()

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Size of the drafter's output vocabulary; must equal the target's."""

    @abstractmethod
    def begin(self, rows: list[DraftContext]) -> torch.Tensor:
        """Catch up with every running row; return raw draft logits [B, V] for the token after each root."""

    @abstractmethod
    def expand(self, node_ids: torch.Tensor, parent_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Raw draft logits [B, m, V] after new tree nodes (node/parent search ids and tokens, each [B, m])."""

    def extend_chain(self, depth: int, tokens: torch.Tensor) -> torch.Tensor:
        """Raw draft logits [B, V] after chain node `depth` (tokens [B]), whose parent is node depth - 1 (0 = root).

        Chains are the common case and need no ancestor bookkeeping; the default goes through `expand`, and
        drafters override it with a cheaper path.
        """
        return chain_from_expand(self.expand)(depth, tokens)

    def move_slot(self, src: int, dst: int) -> None:  # noqa: B027 - optional hook, stateless drafters ignore it
        """The engine moved the row in slot `src` to slot `dst` (compaction after a request finished)."""

    def reset(self) -> None:  # noqa: B027 - optional hook
        """Forget every row (the engine dropped all requests)."""

    def release_cache(self) -> None:  # noqa: B027 - optional hook
        """Free per-row memory: the engine released its KV cache (e.g. while the rollout sleeps); nothing runs."""
