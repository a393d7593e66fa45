"""Decoder-only causal LM (Qwen2, Qwen3, Llama) whose attention reads and writes a slot KV cache.

Why our own module instead of a transformers model: the engine needs to write new keys at arbitrary per-row
cache positions, attend with arbitrary masks (prefill, decode, and later draft-tree verification) and roll back
by just moving a length counter. Parameter names mirror transformers' so HF checkpoints and verl's per-tensor
weight sync load without renaming. Numerics follow transformers' eager/SDPA path (fp32 rotary and RMSNorm).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from verl_tlt.modeling.cpu_linear import CpuLayoutLinear, invalidate_cpu_layouts, set_cpu_layouts

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")


class UnsupportedModelError(ValueError):
    """A transformers checkpoint whose architecture this module cannot run (callers may offer another backend)."""


@dataclass(frozen=True)
class ModelSpec:
    """The architecture facts the engine needs, read from a transformers config."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    output_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    max_position_embeddings: int

    @classmethod
    def from_hf_config(cls, config) -> ModelSpec:
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"The torch rollout engine supports model_type in {SUPPORTED_MODEL_TYPES}, got {model_type!r}."
            )
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise UnsupportedModelError(
                f"The torch rollout engine supports only default RoPE, got rope_type={rope_type!r} "
                f"for model_type={model_type!r}."
            )
        rope_theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        hidden_act = getattr(config, "hidden_act", "silu")
        if hidden_act != "silu":
            raise UnsupportedModelError(f"The torch rollout engine supports hidden_act='silu', got {hidden_act!r}.")
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        if getattr(config, "mlp_bias", False):
            raise UnsupportedModelError(f"The torch rollout engine does not support mlp_bias=True ({model_type!r}).")
        # Qwen2 has q/k/v biases and no o_proj bias; Llama and Qwen3 put `attention_bias` on all four.
        attention_bias = True if model_type == "qwen2" else bool(getattr(config, "attention_bias", False))
        output_bias = False if model_type == "qwen2" else attention_bias
        return cls(
            model_type=model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(rope_theta),
            attention_bias=attention_bias,
            output_bias=output_bias,
            qk_norm=model_type == "qwen3",
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position_embeddings=getattr(config, "max_position_embeddings", 32768),
        )


@dataclass
class AttentionBatch:
    """Where one forward's new tokens go in the cache and what they may attend to.

    rows: the cache slots [row_start, row_start + B) hold this batch's sequences (the running batch is compact).
    write_pos: [B, T] cache position of every new token. attn_mask: [B, 1, T, L] bool over cache positions
    [0, L), True = may attend; or None when every new token may attend to all of [0, kv_len) (a single decode
    position per row with equal lengths), which spares building a mask and lets attention skip it.
    cos/sin: [B, T, head_dim] rotary tables for the new tokens. kv_len: L (taken from the mask when there is one).

    segments (packed training rows, B = 1): the (start, end) token ranges of the samples packed in the row, which
    attend only within themselves; attention then runs sample by sample (`segmented_attention`). key_block: the
    cache holds L / key_block blocks of key_block positions (the unrolled chain stacks one block per draft depth),
    and a sample's keys are its range in every block.
    """

    row_start: int
    write_pos: torch.Tensor
    attn_mask: torch.Tensor | None
    cos: torch.Tensor
    sin: torch.Tensor
    kv_len: int = 0
    segments: tuple[tuple[int, int], ...] | None = None
    key_block: int = 0

    def __post_init__(self) -> None:
        if self.attn_mask is not None:
            self.kv_len = self.attn_mask.shape[-1]
        elif self.kv_len <= 0:
            raise ValueError("AttentionBatch without attn_mask needs kv_len > 0")
        if self.segments is not None:
            if self.attn_mask is None or self.write_pos.shape[0] != 1:
                raise ValueError("AttentionBatch.segments needs one packed row (B = 1) and its attn_mask")
            if self.key_block <= 0 or self.kv_len % self.key_block:
                raise ValueError(
                    f"AttentionBatch.key_block must divide kv_len ({self.kv_len}) into blocks, got {self.key_block}"
                )
        self._rows: torch.Tensor | None = None
        self._rotary: tuple[torch.Tensor, torch.Tensor] | None = None

    def rows(self, device: torch.device) -> torch.Tensor:
        """[B, 1] cache slot of every row, built once per forward and shared by all layers."""
        if self._rows is None:
            bsz = self.write_pos.shape[0]
            self._rows = torch.arange(self.row_start, self.row_start + bsz, device=device).unsqueeze(-1)
        return self._rows

    def rotary(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos [B, T, 1, D], and sin with its first half negated, built once per forward for all layers: with them the
        rotation is `x * cos + roll(x, D / 2) * signed_sin`, which is rotate_half's result bit for bit (negating a
        factor instead of a product is exact) in three elementwise kernels instead of five."""
        if self._rotary is None:
            half = self.sin.shape[-1] // 2
            signed_sin = torch.cat((-self.sin[..., :half], self.sin[..., half:]), dim=-1)
            self._rotary = (self.cos.unsqueeze(2), signed_sin.unsqueeze(2))
        return self._rotary


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype == torch.float32 and self.weight.dtype == torch.float32:
            # One op instead of seven; in fp32 it computes the same expression (torch's composite rms_norm).
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype, max_position: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [..., head_dim] for integer positions [...].

        With max_position (an exclusive bound on `positions` the caller already knows), rows come from a cached
        table instead of being recomputed: the same elementwise math, a handful fewer ops per forward.
        """
        if max_position is None:
            return self._cos_sin(positions, dtype)
        cos, sin = self._table(dtype, max_position)
        return cos[positions], sin[positions]

    def rows(self, start: int, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [length, head_dim] of the consecutive positions start..start+length-1: slices of the cached
        table (no index kernels), for callers that know their positions as numbers."""
        cos, sin = self._table(dtype, start + length)
        return cos[start : start + length], sin[start : start + length]

    def _table(self, dtype: torch.dtype, max_position: int) -> tuple[torch.Tensor, torch.Tensor]:
        table = self._tables.get(dtype)
        if table is None or table[0].shape[0] < max_position or table[0].device != self.inv_freq.device:
            length = max(max_position, 2 * table[0].shape[0] if table is not None else 256)
            # Built outside inference mode so that training code may also read it.
            with torch.inference_mode(False), torch.no_grad():
                table = self._cos_sin(torch.arange(length, device=self.inv_freq.device), dtype)
            self._tables[dtype] = table
        return table

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # [..., head_dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size, self.kv_size = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        # q, k and v in one matmul (fewer kernel calls per layer); hf_weight_views() exposes the HF names.
        self.qkv_proj = CpuLayoutLinear(spec.hidden_size, self.q_size + 2 * self.kv_size, bias=spec.attention_bias)
        self.o_proj = CpuLayoutLinear(self.q_size, spec.hidden_size, bias=spec.output_bias)
        if spec.qk_norm:
            self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
            self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def hf_weight_views(self) -> dict[str, torch.Tensor]:
        """transformers' q_proj/k_proj/v_proj tensors as views into the fused qkv_proj."""
        bounds = {"q_proj": (0, self.q_size), "k_proj": (self.q_size, self.q_size + self.kv_size)}
        bounds["v_proj"] = (self.q_size + self.kv_size, self.q_size + 2 * self.kv_size)
        views = {}
        for name, (start, end) in bounds.items():
            views[f"{name}.weight"] = self.qkv_proj.weight.data[start:end]
            if self.qkv_proj.bias is not None:
                views[f"{name}.bias"] = self.qkv_proj.bias.data[start:end]
        return views

    def forward(
        self, x: torch.Tensor, batch: AttentionBatch, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        bsz, seq, _ = x.shape
        qk, v = self.qkv_proj(x).split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = qk.view(bsz, seq, self.num_heads + self.num_kv_heads, self.head_dim)
        v = v.view(bsz, seq, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            qk = torch.cat([self.q_norm(qk[:, :, : self.num_heads]), self.k_norm(qk[:, :, self.num_heads :])], dim=2)
        cos, signed_sin = batch.rotary()  # [B, T, 1, head_dim]
        # q and k heads rotated together (half the elementwise calls); the roll is rotate_half without its negation.
        qk = qk * cos + torch.roll(qk, self.head_dim // 2, dims=-1) * signed_sin
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=2)

        rows = batch.rows(x.device)  # [B, 1]
        # Advanced indices on dims 0 and 2 put the [B, T] index dims first: target shape [B, T, kv_heads, D].
        k_cache[rows, :, batch.write_pos] = k.to(k_cache.dtype)
        v_cache[rows, :, batch.write_pos] = v.to(v_cache.dtype)
        keys = k_cache[batch.row_start : batch.row_start + bsz, :, : batch.kv_len]  # [B, kv_heads, L, D]
        values = v_cache[batch.row_start : batch.row_start + bsz, :, : batch.kv_len]
        query, gqa = q.transpose(1, 2), self.num_kv_heads != self.num_heads
        if batch.segments is not None:
            out = segmented_attention(query, keys, values, batch, gqa)
        else:
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=batch.attn_mask, enable_gqa=gqa)
        # out: [B, heads, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(bsz, seq, self.num_heads * self.head_dim))


def segmented_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, batch: AttentionBatch, enable_gqa: bool
) -> torch.Tensor:
    """Attention of a packed row sample by sample: query [1, heads, T, D], keys/values [1, kv_heads, L, D].

    The same result as one attention over the row with its block-diagonal mask (the mask's zeros outside a
    sample's block add nothing), in a fraction of the work: the dense form computes every pair of the row, and a
    row of a few samples is mostly pairs the mask discards.
    """
    block = batch.key_block
    num_blocks = batch.kv_len // block
    outputs = []
    for start, end in batch.segments:
        if num_blocks == 1:
            columns = slice(start, end)
            mask = batch.attn_mask[:, :, start:end, columns]
            sample_keys, sample_values = keys[:, :, columns], values[:, :, columns]
        else:
            columns = torch.cat([torch.arange(b * block + start, b * block + end) for b in range(num_blocks)])
            columns = columns.to(keys.device)
            mask = batch.attn_mask[:, :, start:end].index_select(-1, columns)
            sample_keys, sample_values = keys.index_select(2, columns), values.index_select(2, columns)
        outputs.append(
            F.scaled_dot_product_attention(
                query[:, :, start:end], sample_keys, sample_values, attn_mask=mask, enable_gqa=enable_gqa
            )
        )
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.intermediate_size = spec.intermediate_size
        self.gate_up_proj = CpuLayoutLinear(spec.hidden_size, 2 * spec.intermediate_size, bias=False)
        self.down_proj = CpuLayoutLinear(spec.intermediate_size, spec.hidden_size, bias=False)

    def hf_weight_views(self) -> dict[str, torch.Tensor]:
        """transformers' gate_proj/up_proj weights as views into the fused gate_up_proj."""
        size = self.intermediate_size
        return {
            "gate_proj.weight": self.gate_up_proj.weight.data[:size],
            "up_proj.weight": self.gate_up_proj.weight.data[size:],
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.self_attn = Attention(spec)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, x, batch: AttentionBatch, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), batch, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderBody(nn.Module):
    """Named `model` inside CausalLM so parameter names match transformers (`model.layers.0...`)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class CausalLM(nn.Module):
    """Target model for the engine. `forward` returns final hidden states; `logits` applies the LM head."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.model = DecoderBody(spec)
        self.lm_head = CpuLayoutLinear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(spec.head_dim, spec.rope_theta)
        # Counts weight loads (`invalidate_weight_caches`), so caches derived from the weights elsewhere (a drafter's
        # draft-vocabulary head) know when to rebuild: writes through `.data` leave the parameters' versions alone.
        self.weights_generation = 0
        # Residual-stream states (after that many layers) that `forward` also returns, for an EAGLE-3 drafter.
        self.feature_layers: tuple[int, ...] = ()
        # Layers of the model this one stands for: a drafter worker's one-layer copy of a deep target
        # (`load_drafter_parts`) says how deep the real one is, which EAGLE-3's default feature layers depend on.
        self.source_num_layers = spec.num_layers

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        batch: AttentionBatch,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        """input_ids/positions: [B, T]. Returns normed last-layer hidden states [B, T, H]; with `feature_layers`
        set, [B, T, (1 + n) * H]: those followed by the residual stream after each of the n feature layers (what an
        EAGLE-3 drafter reads; `logits` takes the first H values)."""
        x = self.model.embed_tokens(input_ids)
        wanted = self.feature_layers
        features = [x] if 0 in wanted else []
        for index, (layer, k_cache, v_cache) in enumerate(zip(self.model.layers, k_caches, v_caches, strict=True)):
            x = layer(x, batch, k_cache, v_cache)
            if index + 1 in wanted:
                features.append(x)
        if not wanted:
            return self.model.norm(x)
        if len(features) != len(wanted):
            raise ValueError(
                f"feature_layers {list(wanted)} must be distinct, increasing layer counts in "
                f"[0, {len(self.model.layers)}]"
            )
        return torch.cat([self.model.norm(x), *features], dim=-1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits of final hidden states (of the first H values, where `forward` appended features)."""
        if hidden.shape[-1] != self.spec.hidden_size:
            hidden = hidden[..., : self.spec.hidden_size]
        return self.lm_head(hidden)

    def use_cpu_layouts(self, enabled: bool) -> None:
        """Serve CPU inference forwards from weight copies in faster kernel layouts (see `engine.cpu_linear`).

        Each linear keeps at most a transposed copy (products of <= 4 rows with small weights) and a oneDNN-packed
        copy (large products), built lazily, so weight memory can up to triple. Copies are rebuilt after
        `invalidate_weight_caches` (called by every weight load).
        """
        set_cpu_layouts(self, enabled)

    def invalidate_weight_caches(self) -> None:
        invalidate_cpu_layouts(self)
        self.weights_generation += 1

    def drafter_shared_views(self) -> dict[str, torch.Tensor]:
        """The weights an EAGLE drafter shares with this model, under transformers names: the embedding, and the LM
        head unless it is tied to the embedding."""
        views = self.hf_weight_views()
        names = ["model.embed_tokens.weight"] + ([] if self.spec.tie_word_embeddings else ["lm_head.weight"])
        return {name: views[name] for name in names}

    def hf_weight_views(self) -> dict[str, torch.Tensor]:
        """Every weight under its transformers name; fused projections appear as views of their parts.

        Writing into a view writes the fused parameter, so checkpoints and verl's weight sync load unchanged.
        """
        views = {}
        for name, param in self.named_parameters(remove_duplicate=False):
            if not name.endswith(("qkv_proj.weight", "qkv_proj.bias", "gate_up_proj.weight")):
                views[name] = param.data
        for prefix, module in self.named_modules():
            if isinstance(module, (Attention, MLP)):
                views.update({f"{prefix}.{name}": view for name, view in module.hf_weight_views().items()})
        return views

    def rotary_tables(
        self, positions: torch.Tensor, dtype: torch.dtype, max_position: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for `positions`; pass max_position (> every position) to read them from a cached table."""
        return self.rotary(positions, dtype, max_position)

    def rotary_rows(self, start: int, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [length, head_dim] for positions start..start+length-1 (see RotaryEmbedding.rows)."""
        return self.rotary.rows(start, length, dtype)


@torch.no_grad()
def sequence_hidden_states(model: CausalLM, token_ids: list[int]) -> torch.Tensor:
    """Final (normed) hidden states [T, H] of one whole sequence, computed without the engine's KV cache, followed by
    the model's `feature_layers` states if it has any ([T, (1 + n) * H], see `forward`).

    This is what an EAGLE drafter trains on: the same tensor the engine hands its drafter during decoding.
    """
    spec = model.spec
    param = model.lm_head.weight
    length = len(token_ids)
    ids = torch.tensor([token_ids], device=param.device)
    positions = torch.arange(length, device=param.device).unsqueeze(0)
    caches = [torch.zeros(1, spec.num_kv_heads, length, spec.head_dim, device=param.device, dtype=param.dtype)]
    k_caches = caches * spec.num_layers  # one scratch buffer is enough: each layer writes before it reads
    v_caches = [torch.zeros_like(caches[0])] * spec.num_layers
    cos, sin = model.rotary_tables(positions, param.dtype)
    mask = torch.ones(length, length, dtype=torch.bool, device=param.device).tril().view(1, 1, length, length)
    batch = AttentionBatch(row_start=0, write_pos=positions, attn_mask=mask, cos=cos, sin=sin)
    return model(ids, positions, batch, k_caches, v_caches)[0]
