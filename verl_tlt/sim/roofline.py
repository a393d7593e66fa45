"""A roofline cost model for GPUs we do not have: a decode step costs the larger of its bytes over the memory
bandwidth and its FLOPs over the peak, plus per-step costs the roofline does not see.

Bytes per GPU and step: the weights (each GPU of a tensor-parallel group holds 1/tp of them) and the KV cache the step
reads (also split over tp). FLOPs: 2 per parameter and token processed, plus attention's 4 per head dimension, layer,
token and cached token it attends to. Both are divided by efficiencies (the share of peak bandwidth and FLOPs that
decode kernels reach), and every step adds a fixed launch cost and, with tp > 1, two all-reduces per layer.

A drafter level (`DraftLevelCost`) is the one-layer EAGLE head plus the tree bookkeeping around it (top-k, sorting,
re-indexing); on GPUs that is launch- and latency-bound, so it is a fixed seconds per level plus its own roofline.

The shapes below are the models' published Hugging Face configs; the accelerators' numbers are the vendors' dense
bf16 peaks and HBM bandwidths. Efficiencies and fixed costs are assumptions each preset states (or fits, and says so).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_tlt.sim.costs import check_step


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape (Hugging Face config names in the comments)."""

    name: str
    layers: int  # num_hidden_layers
    hidden: int  # hidden_size
    intermediate: int  # intermediate_size
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    vocab: int  # vocab_size
    tied_embeddings: bool = False  # tie_word_embeddings

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        attention = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        return attention + 3 * self.hidden * self.intermediate  # gate, up and down projections

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * self.layer_params + embeddings

    @property
    def matmul_params(self) -> int:
        """Parameters every token multiplies: the layers and the output head (not the embedding lookup)."""
        return self.layers * self.layer_params + self.vocab * self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class Accelerator:
    name: str
    hbm_bytes_per_s: float
    peak_flops: float  # dense bf16
    memory_bytes: float


MODELS = {
    "qwen2.5-7b": ModelShape(
        "Qwen2.5-7B", layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, vocab=152064
    ),
    "qwen2.5-32b": ModelShape(
        "Qwen2.5-32B", layers=64, hidden=5120, intermediate=27648, heads=40, kv_heads=8, vocab=152064
    ),
}

ACCELERATORS = {
    "h100-sxm": Accelerator("NVIDIA H100 SXM", hbm_bytes_per_s=3.35e12, peak_flops=989e12, memory_bytes=80e9),
    "h200": Accelerator("NVIDIA H200", hbm_bytes_per_s=4.8e12, peak_flops=989e12, memory_bytes=141e9),
    "a100-80gb": Accelerator("NVIDIA A100 80GB SXM", hbm_bytes_per_s=2.039e12, peak_flops=312e12, memory_bytes=80e9),
}


@dataclass(frozen=True)
class RooflineCost:
    """Seconds of one forward of `model` on a tensor-parallel group of `tp` GPUs of `accelerator`."""

    model: ModelShape
    accelerator: Accelerator
    tp: int = 1
    dtype_bytes: int = 2
    bandwidth_efficiency: float = 0.8
    flops_efficiency: float = 0.6
    step_overhead_s: float = 0.0
    allreduce_s: float = 10e-6  # one small all-reduce on NVLink; two per layer when tp > 1

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        for key in ("bandwidth_efficiency", "flops_efficiency"):
            if not 0 < getattr(self, key) <= 1:
                raise ValueError(f"{key} must be in (0, 1], got {getattr(self, key)}")
        if self.step_overhead_s < 0 or self.allreduce_s < 0:
            raise ValueError("step_overhead_s and allreduce_s must be >= 0")

    def bytes_per_gpu(self, kv_tokens: float) -> float:
        weights = self.model.params * self.dtype_bytes
        return (weights + kv_tokens * self.model.kv_bytes_per_token(self.dtype_bytes)) / self.tp

    def flops_per_gpu(self, batch: int, width: int, kv_tokens: float) -> float:
        tokens = batch * width
        dense = 2 * self.model.matmul_params * tokens
        # Each of a row's `width` tokens attends to that row's cache (kv_tokens / batch on average).
        attention = 4 * self.model.layers * self.model.heads * self.model.head_dim * kv_tokens * width
        return (dense + attention) / self.tp

    def step_seconds(self, batch: int, width: int = 1, kv_tokens: float = 0) -> float:
        check_step(batch, width)
        memory_s = self.bytes_per_gpu(kv_tokens) / (self.accelerator.hbm_bytes_per_s * self.bandwidth_efficiency)
        compute_s = self.flops_per_gpu(batch, width, kv_tokens) / (self.accelerator.peak_flops * self.flops_efficiency)
        communication_s = 2 * self.model.layers * self.allreduce_s if self.tp > 1 else 0.0
        return max(memory_s, compute_s) + self.step_overhead_s + communication_s


@dataclass(frozen=True)
class DraftLevelCost:
    """One drafter level: `level_s` fixed seconds (launch- and latency-bound tree work) plus the roofline of a
    one-layer head of the target's shape reading the target's output head (EAGLE shares it)."""

    target: RooflineCost
    level_s: float

    def step_seconds(self, batch: int, width: int = 1, kv_tokens: float = 0) -> float:
        check_step(batch, width)
        shape = self.target.model
        params = shape.layer_params + shape.vocab * shape.hidden + 2 * shape.hidden * shape.hidden  # + fc
        memory_s = (
            params
            * self.target.dtype_bytes
            / self.target.tp
            / (self.target.accelerator.hbm_bytes_per_s * self.target.bandwidth_efficiency)
        )
        compute_s = (
            2
            * params
            * batch
            * width
            / self.target.tp
            / (self.target.accelerator.peak_flops * self.target.flops_efficiency)
        )
        return self.level_s + max(memory_s, compute_s)
