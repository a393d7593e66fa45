"""Bucketed CUDA graphs for the engine's decode and verify forwards (a no-op off CUDA).

Why: on a GPU a small model's decode step is mostly kernel launches; replaying a captured graph launches the whole
forward at once. A graph needs fixed shapes and fixed tensor addresses, so:
- rows are padded up to a batch bucket, and a graph exists per (tokens per row, batch bucket): plain decode has
  width 1, a speculative strategy verifies tree_tokens + 1 positions per row, so strategies with the same width
  share graphs;
- attention always reads the whole cache length (the mask hides what is not there yet), so the KV length may
  change from step to step without a new graph; the pool therefore sizes the cache to its full length once;
- inputs are copied into static buffers before each replay, and the output is copied out after it.
Graphs are captured lazily, the first time a (width, bucket) pair that the pool serves is used: plain decode at
every bucket, verify steps only for the widths and batch sizes the pool was built with (with an adaptive policy:
its strategies' widths, up to its threshold). All graphs share one memory pool. When the cache is reallocated
(more slots, or released while the rollout sleeps and allocated again) every graph is dropped and recaptured on
demand.

Padding rows must not disturb live sequences: they run in the cache slots after the batch's rows (free slots, as the
running batch is compact) and write only to the cache's last column, which no real position reaches (the engine
reserves max_draft_tokens + 1 columns past max_model_len).

`capture=False` runs the same static-buffer path without capturing (eager replays): the CPU tests check that the
padding, masks and copies reproduce the engine's ordinary forward exactly.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from verl_tlt.engine.kv_cache import SlotKVCache
from verl_tlt.modeling.model import AttentionBatch

logger = logging.getLogger(__name__)

# Largest padded batch captured (as vLLM's default): above it, steps run without graphs.
MAX_GRAPH_BATCH = 512


def graph_batch_buckets(max_batch: int) -> list[int]:
    """Padded batch sizes: powers of two up to max_batch (capped at MAX_GRAPH_BATCH), and max_batch itself."""
    top = min(max_batch, MAX_GRAPH_BATCH)
    sizes = {1 << i for i in range(top.bit_length()) if 1 << i <= top}
    return sorted(sizes | {top})


@dataclass
class _StaticStep:
    """The buffers one graph reads and writes, and the graph (None when replaying eagerly)."""

    input_ids: torch.Tensor  # [B, T]
    positions: torch.Tensor  # [B, T]
    write_pos: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, 1, T, L]
    cos: torch.Tensor  # [B, T, D]
    sin: torch.Tensor  # [B, T, D]
    output: torch.Tensor | None = None  # [B, T, H], set by the capture
    graph: torch.cuda.CUDAGraph | None = None
    captured_bytes: int = 0

    def static_bytes(self) -> int:
        tensors = (self.input_ids, self.positions, self.write_pos, self.mask, self.cos, self.sin)
        return sum(t.numel() * t.element_size() for t in tensors)


class StepGraphPool:
    """Serves `forward(input_ids, positions, batch, k_caches, v_caches)` for decode/verify steps from graphs.

    forward: the target's forward (the model, or anything with its signature). batch_buckets: padded batch sizes;
    batches above the largest are not served. widths: tokens per row of the verify steps that may be captured (None:
    any); plain decode (width 1) is always served. verify_max_batch: verify steps are served only up to this batch
    size (the policy's threshold; None: any). min_slots: cache slots to allocate up front (the engine's
    max_num_seqs), so that admitting requests up to that many does not reallocate the cache under the graphs.
    """

    def __init__(
        self,
        forward: Callable[..., torch.Tensor],
        cache: SlotKVCache,
        rotary_dim: int,
        dtype: torch.dtype,
        *,
        batch_buckets: Iterable[int],
        widths: Iterable[int] | None = None,
        verify_max_batch: int | None = None,
        min_slots: int = 1,
        capture: bool = True,
    ):
        self.forward, self.cache, self.rotary_dim, self.dtype = forward, cache, rotary_dim, dtype
        self.batch_buckets = sorted({int(b) for b in batch_buckets})
        if not self.batch_buckets or self.batch_buckets[0] < 1:
            raise ValueError(f"batch_buckets must be positive batch sizes, got {self.batch_buckets}")
        self.widths = None if widths is None else frozenset(int(w) for w in widths)
        self.verify_max_batch = verify_max_batch
        self.min_slots = max(min_slots, self.batch_buckets[-1])
        self.capture = capture
        if capture and cache.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA cache, got {cache.device}; use capture=False to test off CUDA")
        self.steps: dict[tuple[int, int], _StaticStep] = {}
        # Weak references to the cache tensors the graphs were made with: dead or different ones mean new memory.
        self._cache_refs: list[weakref.ref] = []
        self._memory_pool = torch.cuda.graph_pool_handle() if capture else None
        self.num_captures = 0
        self.num_replays = 0
        self.num_padded_rows = 0  # padding rows computed, over all replays (the price of the buckets)

    @property
    def scratch_column(self) -> int:
        """The cache column padding rows write to: past every position a real token can occupy."""
        return self.cache.max_len - 1

    def bucket(self, batch_size: int) -> int | None:
        for size in self.batch_buckets:
            if size >= batch_size:
                return size
        return None

    def serves(self, width: int, batch_size: int) -> bool:
        if self.bucket(batch_size) is None:
            return False
        if width == 1:
            return True
        fits = self.verify_max_batch is None or batch_size <= self.verify_max_batch
        return fits and (self.widths is None or width in self.widths)

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        write_pos: torch.Tensor,
        mask: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """The forward of rows [0, b) of the cache on inputs [b, T] (mask [b, 1, T, L<=max_len]); [b, T, H]."""
        rows, width = input_ids.shape
        if not self.serves(width, rows):
            raise ValueError(f"StepGraphPool does not serve {rows} rows x {width} tokens; check serves() first")
        bucket = self.bucket(rows)
        self._check_cache()
        step = self.steps.get((width, bucket))
        if step is None:
            step = self._capture(width, bucket)
        self._load(step, rows, input_ids, positions, write_pos, mask, cos, sin)
        if step.graph is not None:
            step.graph.replay()
        else:
            step.output = self._forward_static(step)
        self.num_replays += 1
        self.num_padded_rows += bucket - rows
        return step.output[:rows].clone()  # the buffer is overwritten by the next replay

    def memory_report(self) -> dict:
        """Graphs held, and the memory they hold (static buffers; on CUDA also what capturing allocated)."""
        return {
            "graphs": len(self.steps),
            "keys": sorted(f"width{width}_batch{bucket}" for width, bucket in self.steps),
            "static_bytes": sum(step.static_bytes() for step in self.steps.values()),
            "captured_bytes": sum(step.captured_bytes for step in self.steps.values()),
            "captures": self.num_captures,
            "replays": self.num_replays,
            "padded_rows": self.num_padded_rows,
        }

    def reset(self) -> None:
        """Drop every graph and its buffers (call before the cache's memory is released)."""
        self.steps.clear()
        self._cache_refs = []

    # ----- internals ---------------------------------------------------------------------------------------

    def _check_cache(self) -> None:
        """Size the cache to its full length once; drop the graphs if its tensors changed since they were made."""
        self.cache.ensure_capacity(max(self.min_slots, self.cache.num_slots), self.cache.max_len)
        tensors = self.cache.k + self.cache.v
        same = len(tensors) == len(self._cache_refs) and all(
            ref() is tensor for ref, tensor in zip(self._cache_refs, tensors, strict=True)
        )
        if not same:
            if self.steps:
                logger.info("KV cache reallocated: dropping %d CUDA graphs (recaptured on demand)", len(self.steps))
            self.steps.clear()
            self._cache_refs = [weakref.ref(tensor) for tensor in tensors]

    def _capture(self, width: int, bucket: int) -> _StaticStep:
        device, length = self.cache.device, self.cache.max_len
        step = _StaticStep(
            input_ids=torch.zeros(bucket, width, dtype=torch.long, device=device),
            positions=torch.zeros(bucket, width, dtype=torch.long, device=device),
            write_pos=torch.full((bucket, width), self.scratch_column, dtype=torch.long, device=device),
            mask=torch.zeros(bucket, 1, width, length, dtype=torch.bool, device=device),
            cos=torch.ones(bucket, width, self.rotary_dim, dtype=self.dtype, device=device),
            sin=torch.zeros(bucket, width, self.rotary_dim, dtype=self.dtype, device=device),
        )
        step.mask[:, :, :, 0] = True  # every row attends to something: no all-masked softmax
        if self.capture:
            before = torch.cuda.memory_allocated(device)
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):  # warm-up outside the graph (lazy initialisations, autotuning)
                for _ in range(2):
                    self._forward_static(step)
            torch.cuda.current_stream(device).wait_stream(side)
            step.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(step.graph, pool=self._memory_pool):
                step.output = self._forward_static(step)
            step.captured_bytes = torch.cuda.memory_allocated(device) - before
            logger.info("captured CUDA graph width=%d batch=%d (%d bytes)", width, bucket, step.captured_bytes)
        self.num_captures += 1
        self.steps[(width, bucket)] = step
        return step

    def _forward_static(self, step: _StaticStep) -> torch.Tensor:
        batch = AttentionBatch(row_start=0, write_pos=step.write_pos, attn_mask=step.mask, cos=step.cos, sin=step.sin)
        return self.forward(step.input_ids, step.positions, batch, self.cache.k, self.cache.v)

    def _load(self, step: _StaticStep, rows: int, input_ids, positions, write_pos, mask, cos, sin) -> None:
        step.input_ids[:rows].copy_(input_ids)
        step.positions[:rows].copy_(positions)
        step.write_pos[:rows].copy_(write_pos)
        length = mask.shape[-1]
        step.mask[:rows, :, :, :length].copy_(mask)
        step.mask[:rows, :, :, length:] = False
        step.cos[:rows].copy_(cos)
        step.sin[:rows].copy_(sin)
        if rows < step.input_ids.shape[0]:  # padding rows: harmless inputs, and writes to the scratch column only
            step.input_ids[rows:] = 0
            step.positions[rows:] = 0
            step.write_pos[rows:] = self.scratch_column
            step.mask[rows:] = False
            step.mask[rows:, :, :, 0] = True
            step.cos[rows:] = 1
            step.sin[rows:] = 0
