"""Slot KV cache: one slot per running sequence, grown on demand, compacted when sequences leave.

The running batch always occupies slots [0, num_running), so attention reads a plain view of the cache
(no gather). When a sequence finishes, the last slot is moved into its place (one copy per finish).
"""

from __future__ import annotations

import torch

from verl_tlt.modeling.model import ModelSpec


class SlotKVCache:
    def __init__(self, model_spec: ModelSpec, *, dtype: torch.dtype, device: torch.device | str, max_len: int):
        self.spec, self.dtype, self.device, self.max_len = model_spec, dtype, torch.device(device), max_len
        self.num_slots = 0
        self.capacity_len = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def ensure_capacity(self, num_slots: int, length: int) -> None:
        """Make room for `num_slots` sequences of up to `length` tokens (doubling, capped at max_len)."""
        if length > self.max_len:
            raise ValueError(f"KV cache length {length} exceeds max_model_len={self.max_len}")
        if num_slots <= self.num_slots and length <= self.capacity_len:
            return
        new_slots = max(num_slots, self.num_slots)
        if num_slots > self.num_slots:
            new_slots = max(num_slots, 2 * self.num_slots, 4)
        new_len = self.capacity_len
        if length > self.capacity_len:
            new_len = min(self.max_len, max(length, 2 * self.capacity_len, 64))
        shape = (new_slots, self.spec.num_kv_heads, new_len, self.spec.head_dim)
        new_k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.spec.num_layers)]
        new_v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.spec.num_layers)]
        if self.k:  # growing: keep what is cached (nothing to copy on the first allocation)
            for old, new in zip(self.k + self.v, new_k + new_v, strict=True):
                new[: old.shape[0], :, : old.shape[2]] = old
        self.k, self.v = new_k, new_v
        self.num_slots, self.capacity_len = new_slots, new_len

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` cached positions of slot `src` into slot `dst`."""
        for cache in self.k + self.v:
            cache[dst, :, :length] = cache[src, :, :length]

    def compact_rows(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy position src[i] to dst[i] in slot rows[i], every layer (accepted draft-tree paths)."""
        for cache in self.k + self.v:
            cache[rows, :, dst] = cache[rows, :, src]  # the right side is gathered first, so overlaps are safe

    def release(self) -> None:
        """Drop all cache memory (e.g. while the rollout sleeps)."""
        self.k, self.v = [], []
        self.num_slots = self.capacity_len = 0
