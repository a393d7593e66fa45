"""The EAGLE drafter's inference forward in a dozen tensor ops, from weights laid out once for them.

Why: the drafter runs several times per speculative step (`begin`, then once per draft level), and at the small
batches where speculation pays each of those forwards is mostly per-op overhead: module calls, dispatch, and a
handful of elementwise kernels for every product. Speculation only gains what the drafter leaves of the target's
time, so this path computes exactly `EagleDrafterModel.forward` (same weights, same math, float rounding aside)
with fewer, fused calls:
- the q/k rotation is folded into the projection: rotate_half is linear, so rotate_half(x W + b) equals x W' + b'
  with W', b' the rotated columns of W, b. One product yields q, k, v and the rotated q, k, and the rotary update
  is one multiply and one fused multiply-add (Qwen3's per-head q/k norms sit between the projection and the
  rotation, so there the rotation stays explicit);
- the residual additions ride on the products (`addmm`), and the products use contiguous transposed weights
  (the layout small-row products are fastest in on CPU, `engine.cpu_linear`).
EAGLE-3 drafters (`verl_tlt.drafter.eagle3_model`) take the same path with their own front: fc fuses the target's
aux features (the drafter's own features skip it), and q/k/v read [norm(embedding), norm(feature)] with the feature
as the residual; from the attention on the layer is the same.

Training never uses this path. Its layouts are copies of the drafter's parameters, rebuilt by `refresh()` when
their version changed (an optimizer step or `load_state_dict`; writes through `.data` need `invalidate()`). The
engine's drafter refreshes once per speculative step (in `begin`), not per forward: reading the versions of
seven parameters through module attributes costs as much as a small product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.modeling.model import rotate_half


def _kept(keep: list[int], query: torch.Tensor, x: torch.Tensor, mask: torch.Tensor | None):
    """The kept position of each row: query [B, 1, heads, D], residual [B, H], mask [B, 1, 1, L] (or None)."""
    if len(keep) == 1:  # batch 1: slices, no index tensors
        position = slice(keep[0], keep[0] + 1)
        kept_mask = None if mask is None else mask[:, :, position]
        return query[:, position], x[:, keep[0]], kept_mask
    rows = torch.arange(len(keep), device=query.device)
    index = torch.tensor(keep, device=query.device)
    kept_mask = None if mask is None else mask[rows, :, index].unsqueeze(2)
    return query[rows, index].unsqueeze(1), x[rows, index], kept_mask


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """`norm(x)`, through RMSNorm's own fp32 path without the module call where it applies."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)
    return norm(x)


@dataclass
class _Layouts:
    versions: tuple[int, ...]
    fc: torch.Tensor  # [2H, H] (EAGLE-3: [n*H, H])
    qkv: torch.Tensor  # [H, q + 2kv (+ q + kv rotated, when folded)]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [q, H]
    o_bias: torch.Tensor | None
    gate_up: torch.Tensor  # [H, 2I]
    down: torch.Tensor  # [I, H]


class EagleInferenceForward:
    """`EagleDrafterModel.forward` for inference: features [B, T, H] from tokens, target features and a KV cache."""

    def __init__(self, model: EagleDrafterModel):
        self.model = model
        attn = model.layer.self_attn
        self.num_heads, self.num_kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.q_size, self.kv_size = attn.q_size, attn.kv_size
        self.fold_rotation = attn.q_norm is None
        self.eagle3 = model.family == "eagle3"
        self.intermediate_size = model.layer.mlp.intermediate_size
        self._layouts: _Layouts | None = None
        self._slots: dict[tuple[int, torch.device], torch.Tensor] = {}  # [B, 1] cache rows, by batch size
        self._param_list: list[torch.Tensor | None] | None = None

    def invalidate(self) -> None:
        """Forget the layouts (after writes through `.data`, or after replacing a parameter object)."""
        self._layouts = None
        self._param_list = None

    def refresh(self) -> None:
        """Rebuild the layouts if a parameter changed since they were made."""
        if self._param_list is None:  # looked up once: module attribute access is slow, and in-place updates keep them
            self._param_list = self._params()
        versions = tuple(p._version for p in self._param_list if p is not None)
        if self._layouts is None or self._layouts.versions != versions:
            self._layouts = self._build(self._param_list, versions)

    def __call__(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        write_pos: torch.Tensor,
        mask: torch.Tensor | None,
        kv_len: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        keep: list[int] | None = None,
        write_start: int | None = None,
    ) -> torch.Tensor:
        """tokens [B, T] (t_{j+1}), hidden [B, T, H] (h_j; EAGLE-3: the target's vector or its own feature); rows
        are cache slots 0..B-1; mask [B, 1, T, L] or None.

        write_start: when every row writes the same consecutive positions write_start..write_start+T-1 (batch 1,
        or rows of equal length), the keys and values go in by slicing instead of through index tensors.

        Returns features [B, T, H]; with `keep` (one position per row), only those: [B, 1, H]. Every position still
        writes its keys and values to the cache, but attention, o_proj and the MLP run for the kept ones alone
        (`begin` needs only each row's last feature; its other positions only fill the cache).
        """
        if self._layouts is None:
            self.refresh()
        w = self._layouts
        model = self.model
        rows, width = tokens.shape
        hidden_size = model.spec.hidden_size
        embeds = F.embedding(tokens, model.target.model.embed_tokens.weight)
        if self.eagle3:
            x, layer_input = self._eagle3_front(embeds.view(rows * width, hidden_size), hidden, w.fc)
        else:
            x = torch.cat([embeds, hidden.to(embeds.dtype)], dim=-1).view(rows * width, 2 * hidden_size) @ w.fc
            layer_input = x
        qkv = layer_input @ w.qkv if w.qkv_bias is None else torch.addmm(w.qkv_bias, layer_input, w.qkv)
        heads = self.num_heads + self.num_kv_heads
        qkv = qkv.view(rows, width, -1, self.head_dim)  # heads: q, k, v, then (folded) rotated q, k
        qk, v = qkv[:, :, :heads], qkv[:, :, heads : heads + self.num_kv_heads]
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # [B, T, 1, D]
        if self.fold_rotation:
            rotated = qkv[:, :, heads + self.num_kv_heads :]
        else:
            attn = model.layer.self_attn
            qk = torch.cat([attn.q_norm(qk[:, :, : self.num_heads]), attn.k_norm(qk[:, :, self.num_heads :])], dim=2)
            rotated = rotate_half(qk)
        qk = torch.addcmul(qk * cos, rotated, sin)
        if write_start is not None:
            columns = slice(write_start, write_start + width)
            k_cache[:rows, :, columns] = qk[:, :, self.num_heads :].transpose(1, 2).to(k_cache.dtype)
            v_cache[:rows, :, columns] = v.transpose(1, 2).to(v_cache.dtype)
        else:
            slots = self._slots.get((rows, tokens.device))
            if slots is None:
                slots = self._slots[(rows, tokens.device)] = torch.arange(rows, device=tokens.device).unsqueeze(-1)
            k_cache[slots, :, write_pos] = qk[:, :, self.num_heads :].to(k_cache.dtype)
            v_cache[slots, :, write_pos] = v.to(v_cache.dtype)
        query = qk[:, :, : self.num_heads]
        if keep is not None:
            query, x, mask = _kept(keep, query, x.view(rows, width, hidden_size), mask)
            width = 1
        out = F.scaled_dot_product_attention(
            query.transpose(1, 2),
            k_cache[:rows, :, :kv_len],
            v_cache[:rows, :, :kv_len],
            attn_mask=mask,
            enable_gqa=self.num_kv_heads != self.num_heads,
        )  # [B, heads, T, D]
        out = out.transpose(1, 2).reshape(rows * width, self.q_size)
        x = torch.addmm(x, out, w.o) if w.o_bias is None else torch.addmm(x + w.o_bias, out, w.o)
        normed = _rms_norm(x, model.layer.post_attention_layernorm)
        gate_up = normed @ w.gate_up
        act = F.silu(gate_up[:, : self.intermediate_size]).mul_(gate_up[:, self.intermediate_size :])
        return torch.addmm(x, act, w.down).view(rows, width, hidden_size)

    def _eagle3_front(self, embeds: torch.Tensor, hidden: torch.Tensor, fc: torch.Tensor):
        """(residual, q/k/v input) of an EAGLE-3 layer: the feature (target aux features fused by fc, or the drafter's
        own) and [norm(embedding), norm(feature)]."""
        hidden_size = embeds.shape[-1]
        feature = hidden.to(embeds.dtype)
        if feature.shape[-1] != hidden_size:
            feature = self.model.input_features(feature).reshape(-1, fc.shape[0]) @ fc
        else:
            feature = feature.reshape(-1, hidden_size)
        layer = self.model.layer
        normed = torch.cat([_rms_norm(embeds, layer.input_layernorm), _rms_norm(feature, layer.hidden_norm)], dim=-1)
        return feature, normed

    def _params(self) -> list[torch.Tensor | None]:
        attn, mlp = self.model.layer.self_attn, self.model.layer.mlp
        return [
            self.model.fc.weight,
            attn.qkv_proj.weight,
            attn.qkv_proj.bias,
            attn.o_proj.weight,
            attn.o_proj.bias,
            mlp.gate_up_proj.weight,
            mlp.down_proj.weight,
        ]

    @torch.no_grad()
    def _build(self, params: list[torch.Tensor | None], versions: tuple[int, ...]) -> _Layouts:
        fc, qkv, qkv_bias, o, o_bias, gate_up, down = (p.detach() if p is not None else None for p in params)
        qkv_t = qkv.t()
        if self.fold_rotation:
            heads = self.num_heads + self.num_kv_heads
            qk_columns = self.q_size + self.kv_size
            rotated = rotate_half(qkv_t[:, :qk_columns].reshape(-1, heads, self.head_dim)).reshape(-1, qk_columns)
            qkv_t = torch.cat([qkv_t, rotated], dim=1)
            if qkv_bias is not None:
                rotated_bias = rotate_half(qkv_bias[:qk_columns].view(heads, self.head_dim)).reshape(-1)
                qkv_bias = torch.cat([qkv_bias, rotated_bias])
        return _Layouts(
            versions=versions,
            fc=fc.t().contiguous(),
            qkv=qkv_t.contiguous(),
            qkv_bias=None if qkv_bias is None else qkv_bias.clone(),
            o=o.t().contiguous(),
            o_bias=None if o_bias is None else o_bias.clone(),
            gate_up=gate_up.t().contiguous(),
            down=down.t().contiguous(),
        )
