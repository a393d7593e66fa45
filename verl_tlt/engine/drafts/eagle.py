"""Runs an EAGLE drafter inside the torch engine: its own KV cache per slot, tree drafting with ancestor masks.

Pair j of a row is (target hidden h_j, token t_{j+1}) at position j; the drafter has consumed pairs [0, synced).
`begin` feeds the new pairs and keeps each row's last output feature (the root's feature, which predicts the
token after the root). `expand` feeds tree nodes: node c with parent p is the pair (feature(p), token(c)) at
position committed + depth(p), one past its parent, written in scratch cache slots after the committed pairs and
attending to the committed pairs plus its expanded ancestors. Chains take `extend_chain`, the same layout
without the bookkeeping: chain node d sits in scratch column d - 1 and its ancestors are exactly the columns
before it. Scratch entries are simply overwritten by the next `begin`, so nothing needs rolling back.
"""

from __future__ import annotations

import dataclasses

import torch

from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.engine.drafts.base import DraftContext, Drafter
from verl_tlt.engine.drafts.eagle_forward import EagleInferenceForward
from verl_tlt.engine.kv_cache import SlotKVCache


class EagleDrafter(Drafter):
    """The engine-side EAGLE drafter (attach to an engine whose target the model shares embedding/head with)."""

    uses_hidden_states = True

    def __init__(self, model: EagleDrafterModel, max_len: int = 32768):
        self.model = model.eval()
        self.feature_layers = tuple(model.aux_layers)
        param = model.fc.weight
        self.device, self.dtype = param.device, param.dtype
        layer_spec = dataclasses.replace(model.spec, num_layers=1)
        self.cache = SlotKVCache(layer_spec, dtype=self.dtype, device=self.device, max_len=max_len)
        self.forward = EagleInferenceForward(self.model)  # the model's forward as few fused ops (eagle_inference)
        self.synced: list[int] = []  # pairs in each slot's cache
        self._root: _DraftRoot | None = None  # set by begin: where this step's chain or tree starts
        self._search: _TreeSearchState | None = None  # tree bookkeeping, made by the first expand after begin

    @property
    def vocab_size(self) -> int:
        return self.model.spec.vocab_size

    @torch.inference_mode()
    def begin(self, rows: list[DraftContext]) -> torch.Tensor:
        self.forward.refresh()  # new drafter weights take effect from this speculative step
        self._ensure_slots(len(rows))
        starts = [row.num_synced for row in rows]
        counts = [len(row.token_ids) - 1 - row.num_synced for row in rows]
        if min(counts) < 1:
            raise ValueError(f"EagleDrafter.begin needs at least one new (hidden, token) pair per row, got {counts}")
        for b, row in enumerate(rows):
            if row.hidden_states is None or row.hidden_states.shape[0] != counts[b]:
                raise ValueError(f"EagleDrafter needs {counts[b]} target hidden states for row {b}")
        width = max(counts)
        ends = [start + count for start, count in zip(starts, counts, strict=True)]  # pairs per row after this
        # Only each row's last position yields a feature that is used (the root's); the others fill the cache.
        last = [count - 1 for count in counts]
        if len(rows) == 1:  # the long tail's common case: no padding, and the one query attends to everything
            tokens = torch.tensor([rows[0].token_ids[starts[0] + 1 :]], device=self.device)
            hidden = rows[0].hidden_states.unsqueeze(0)
            self._reserve(1, ends[0])
            root_features = self._forward(tokens, hidden, None, None, None, ends[0], last, start=starts[0])[:, 0]
        else:
            tokens = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
            features = rows[0].hidden_states.shape[-1]  # the target's vector: EAGLE-3 reads more than its final state
            hidden = torch.zeros(len(rows), width, features, dtype=self.dtype, device=self.device)
            for b, row in enumerate(rows):
                tokens[b, : counts[b]] = torch.tensor(row.token_ids[starts[b] + 1 :], device=self.device)
                hidden[b, : counts[b]] = row.hidden_states
            # A shorter row's padding goes to the column just past its pairs (the next draft node overwrites it),
            # so no row reaches beyond its own length: rows that just joined with long prompts sit beside rows
            # near max_model_len.
            offsets = torch.arange(width, device=self.device).unsqueeze(0)
            positions = torch.tensor(starts, device=self.device).unsqueeze(1) + offsets
            positions = torch.minimum(positions, torch.tensor(ends, device=self.device).unsqueeze(1))  # [B, T]
            kv_len = max(ends) + (1 if min(counts) < width else 0)
            self._reserve(len(rows), kv_len)
            mask = torch.arange(kv_len, device=self.device).view(1, 1, kv_len) <= positions.unsqueeze(-1)
            root_features = self._forward(tokens, hidden, positions, positions, mask.unsqueeze(1), kv_len, last)[:, 0]
        self.synced[: len(rows)] = [s + c for s, c in zip(starts, counts, strict=True)]
        self._root = _DraftRoot(root_features, self.synced[: len(rows)], self.device)
        self._search = None
        return self.model.logits(root_features)

    @torch.inference_mode()
    def extend_chain(self, depth: int, tokens: torch.Tensor) -> torch.Tensor:
        """Chain node `depth` sits at position committed + depth - 1 and attends to everything before it.

        No ancestor masks: the scratch columns before it hold exactly its ancestors, so the mask is a length
        limit, and none at all when every row has the same committed length (batch 1).
        """
        root = self._started()
        if self._search is not None or depth != root.chain_depth + 1:
            raise RuntimeError(
                f"EagleDrafter.extend_chain: node {depth} does not continue the chain (depth {root.chain_depth}"
                f"{', after tree expansions' if self._search is not None else ''}); call begin first"
            )
        rows = tokens.shape[0]
        parent = root.features if depth == 1 else root.chain_features
        kv_len = root.max_committed + depth
        self._reserve(rows, kv_len)
        if root.uniform:  # every row at the same position: no mask, and no index tensors for rotary or cache
            start = root.max_committed + depth - 1
            args = (None, None, None, kv_len, None, start)
        else:
            positions = (root.committed + (depth - 1)).unsqueeze(1)  # [B, 1]
            mask = (torch.arange(kv_len, device=self.device) <= positions).view(rows, 1, 1, kv_len)
            args = (positions, positions, mask, kv_len)
        features = self._forward(tokens.unsqueeze(1), parent.unsqueeze(1), *args)[:, 0]
        root.chain_features, root.chain_depth = features, depth
        return self.model.logits(features)

    @torch.inference_mode()
    def expand(self, node_ids: torch.Tensor, parent_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        root = self._started()
        if root.chain_depth:
            raise RuntimeError("EagleDrafter.expand after extend_chain: call begin first")
        if self._search is None:
            self._search = _TreeSearchState(root.features, root.committed)
        search = self._search
        parent_features, positions, write_pos, ancestors = search.add_nodes(node_ids, parent_ids)
        kv_len = int(write_pos.max()) + 1
        self._reserve(node_ids.shape[0], kv_len)
        cols = torch.arange(kv_len, device=self.device).view(1, 1, kv_len)
        mask = (cols < search.committed.view(-1, 1, 1)).expand(-1, node_ids.shape[1], -1).clone()  # committed pairs
        scratch = (search.committed.view(-1, 1, 1) + torch.arange(ancestors.shape[-1], device=self.device)).expand_as(
            ancestors
        )
        mask.scatter_(2, scratch, ancestors)  # plus the node's expanded ancestors and itself
        features = self._forward(tokens, parent_features, positions, write_pos, mask.unsqueeze(1), kv_len)
        search.store_features(features)
        return self.model.logits(features)

    def move_slot(self, src: int, dst: int) -> None:
        if src < len(self.synced) and self.synced[src] > 0:
            self.cache.move_slot(src, dst, self.synced[src])
            self.synced[dst] = self.synced[src]

    def reset(self) -> None:
        self.synced = [0] * len(self.synced)
        self._root = None
        self._search = None

    def release_cache(self) -> None:
        self.reset()
        self.cache.release()

    def _ensure_slots(self, count: int) -> None:
        if len(self.synced) < count:
            self.synced.extend([0] * (count - len(self.synced)))

    def _reserve(self, rows: int, kv_len: int) -> None:
        """Cache room for `rows` slots of kv_len pairs. The length cap is the engine's cache length, but a wide tree
        search can expand more nodes ((depth - 1) * top_k scratch columns) than the engine reserves for verifying
        (max_draft_tokens + 1): this cache is the drafter's own, so the cap moves instead of the draft failing."""
        if kv_len > self.cache.max_len:
            self.cache.max_len = kv_len
        self.cache.ensure_capacity(rows, kv_len)

    def _started(self) -> _DraftRoot:
        if self._root is None:
            raise RuntimeError("EagleDrafter: extend_chain/expand called before begin")
        return self._root

    def _forward(self, tokens, hidden, positions, write_pos, mask, kv_len: int, keep=None, start=None) -> torch.Tensor:
        """The drafter's forward; `start` (an int) says that every row's T new pairs sit at positions start..start+T-1,
        which lets rotary and cache writes slice instead of index (positions and write_pos are then unused)."""
        if start is not None:
            cos, sin = self.model.target.rotary_rows(start, tokens.shape[1], self.dtype)
            cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)  # [1, T, D]: the same for every row
        else:
            cos, sin = self.model.target.rotary_tables(positions, self.dtype, max_position=kv_len)
        k_cache, v_cache = self.cache.k[0], self.cache.v[0]
        return self.forward(tokens, hidden, write_pos, mask, kv_len, cos, sin, k_cache, v_cache, keep, start)


class _DraftRoot:
    """What `begin` leaves for this step's drafting: each row's root feature and committed pair count."""

    def __init__(self, features: torch.Tensor, committed: list[int], device: torch.device):
        self.features = features  # [B, H]
        self.committed = torch.tensor(committed, device=device)  # [B]
        self.max_committed = max(committed)
        self.uniform = min(committed) == self.max_committed
        self.chain_depth = 0  # chain nodes drafted so far (extend_chain)
        self.chain_features: torch.Tensor | None = None


class _TreeSearchState:
    """One draft-tree search: where each expanded node sits in the scratch cache, its depth, feature, ancestors.

    Expanded nodes get columns 0, 1, ... in expansion order (scratch cache position committed + column). Column
    lookups go through an "extended" view whose index 0 is the root, so parent index = column + 1, 0 = root.
    """

    def __init__(self, root_features: torch.Tensor, committed: torch.Tensor):
        rows, hidden = root_features.shape
        device = root_features.device
        self.committed = committed  # [B] pairs in each row's cache
        self.features = root_features.unsqueeze(1)  # [B, 1+E, H]: root, then expanded nodes
        self.depths = torch.zeros(rows, 1, dtype=torch.long, device=device)  # [B, 1+E]
        self.ancestors = torch.zeros(rows, 1, 0, dtype=torch.bool, device=device)  # [B, 1+E, E] over columns
        self.index_of = torch.zeros(rows, 1, dtype=torch.long, device=device)  # search id -> extended index

    def add_nodes(self, node_ids: torch.Tensor, parent_ids: torch.Tensor):
        """Register new nodes; return their parents' features [B, m, H], positions and write positions [B, m],
        and ancestor-or-self masks [B, m, E+m] over scratch columns."""
        rows, count = node_ids.shape
        device = node_ids.device
        columns = self.ancestors.shape[-1]
        needed = int(torch.maximum(node_ids.max(), parent_ids.max())) + 1
        if self.index_of.shape[1] < needed:
            self.index_of = torch.nn.functional.pad(self.index_of, (0, needed - self.index_of.shape[1]))
        parent = self.index_of.gather(1, parent_ids)  # [B, m] extended index, 0 = root
        batch = torch.arange(rows, device=device).unsqueeze(1)
        parent_features = self.features[batch, parent]  # [B, m, H]
        parent_depths = self.depths[batch, parent]  # [B, m]
        own = torch.eye(count, dtype=torch.bool, device=device).expand(rows, count, count)
        ancestors = torch.cat([self.ancestors[batch, parent], own], dim=2)  # [B, m, E+m]
        self.ancestors = torch.cat([torch.nn.functional.pad(self.ancestors, (0, count)), ancestors], dim=1)
        self.depths = torch.cat([self.depths, parent_depths + 1], dim=1)
        new_columns = torch.arange(columns, columns + count, device=device)
        self.index_of.scatter_(1, node_ids, (new_columns + 1).expand(rows, count))
        write_pos = self.committed.unsqueeze(1) + new_columns  # [B, m]
        positions = self.committed.unsqueeze(1) + parent_depths  # one past the parent's position
        return parent_features, positions, write_pos, ancestors

    def store_features(self, features: torch.Tensor) -> None:
        self.features = torch.cat([self.features, features], dim=1)
