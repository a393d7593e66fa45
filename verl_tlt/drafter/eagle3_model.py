"""EAGLE-3 drafter: fused low/mid/high target features, one decoder layer, its own head over the draft vocabulary.

What differs from EAGLE-1 (`verl_tlt.drafter.model`), following the EAGLE-3 paper and vLLM's `method: eagle3`
drafters (`llama_eagle3.py`, `qwen3_eagle3.py`), which load what `verl_tlt.drafter.export_eagle3` writes:

* Features: the target's residual stream after layers `aux_layers` (default 2, L/2 and L-3 of L layers: what
  vLLM's `get_eagle3_default_aux_hidden_state_layers` picks and the reference recipe uses), before any norm, i.e.
  transformers' `hidden_states[i]`. `fc` fuses their concatenation (n x H -> H); the drafter's own later drafts
  read its own output feature instead, which skips `fc` (vLLM's `combine_hidden_states` runs on target features
  only).
* The layer: the token's embedding and the feature are normed apart (`input_layernorm`, `hidden_norm`) and
  concatenated, so q/k/v read 2H inputs; the residual is the un-normed feature. A final `norm` feeds the head.
* The head is the drafter's own and trains: `lm_head` holds one row per draft slot, always `draft_capacity` of
  them (vLLM sizes the head once, at engine start, so every version a replica loads in place has that many rows).
  The slots are the map the data chose (`chosen_vocab`, `verl_tlt.drafter.draft_vocab`, grown by appending, so a
  trained slot keeps its row and its optimizer moments) followed by filler: the lowest token ids not in the map
  (before any data, filler alone). New slots start from the target's head rows of their tokens.
* No feature loss: the drafter's features are not the target's, so training scores tokens only (the EAGLE-3
  recipe); the training-time-test unroll (`train_depth`) is what teaches it to read its own features.

The starting point (`from_target`) mirrors EAGLE-1's: the layer is the target's last layer with its residual
branches zeroed, fc passes the last aux feature through, and the final norm is the target's, so the untrained
drafter predicts with the target's head read at layer L-3 (a "logit lens"), a sane start from which it trains.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from verl_tlt.drafter.draft_vocab import DraftVocab
from verl_tlt.drafter.model import attached_target, checked_target
from verl_tlt.modeling.cpu_linear import CpuLayoutLinear
from verl_tlt.modeling.model import MLP, Attention, AttentionBatch, CausalLM, ModelSpec, RMSNorm


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """The target layers an EAGLE-3 drafter reads by default: (2, L // 2, L - 3) as vLLM and the reference pick them;
    for targets of under 7 layers, where those collide, up to three spread over 1..L-1.

    Layer i is the residual stream after i layers, the input of layer i: vLLM can read 0..L-1, never the output of
    the last layer, so neither does this.
    """
    if num_layers < 1:
        raise ValueError(f"an EAGLE-3 drafter needs a target with at least one layer, got {num_layers}")
    if num_layers >= 7:
        return (2, num_layers // 2, num_layers - 3)
    if num_layers == 1:
        return (0,)
    top = num_layers - 1
    return tuple(sorted({round(1 + (top - 1) * k / 2) for k in range(3)}))


def check_aux_layers(aux_layers: tuple[int, ...], num_layers: int) -> None:
    """ValueError unless `aux_layers` are distinct, increasing and in [0, num_layers - 1] (what vLLM can read)."""
    ids = list(aux_layers)
    if not ids or ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] > num_layers - 1:
        raise ValueError(
            f"EAGLE-3 feature layers {ids} must be distinct, increasing and in [0, {num_layers - 1}] for a target of "
            f"{num_layers} layers (layer i = the input of layer i); e.g. {list(default_aux_layers(num_layers))}"
        )


def eagle3_layer_spec(target: ModelSpec) -> ModelSpec:
    """The drafter layer's spec: the target's sizes and q/k norms, no attention biases (vLLM's EAGLE-3 layer has one
    `attention_bias` flag for q/k/v and o_proj, and a Qwen2 target's q/k/v-only biases have no place in it)."""
    return dataclasses.replace(target, attention_bias=False, output_bias=False, num_layers=1)


class Eagle3Layer(nn.Module):
    """One EAGLE-3 decoder layer: attention over [norm(embedding), norm(feature)] (2H wide), the feature as residual."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        hidden = spec.hidden_size
        self.self_attn = Attention(spec)
        q_size, kv_size = self.self_attn.q_size, self.self_attn.kv_size
        self.self_attn.qkv_proj = CpuLayoutLinear(2 * hidden, q_size + 2 * kv_size, bias=False)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(hidden, spec.rms_norm_eps)  # the token's embedding
        self.hidden_norm = RMSNorm(hidden, spec.rms_norm_eps)  # the feature
        self.post_attention_layernorm = RMSNorm(hidden, spec.rms_norm_eps)

    def forward(
        self, embeds: torch.Tensor, feature: torch.Tensor, batch: AttentionBatch, k_cache, v_cache
    ) -> torch.Tensor:
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(feature)], dim=-1)
        residual = feature + self.self_attn(x, batch, k_cache, v_cache)
        return residual + self.mlp(self.post_attention_layernorm(residual))


class Eagle3DrafterModel(nn.Module):
    """Trainable EAGLE-3 drafter (fc, layer, final norm, own head); `attach` binds the frozen target embedding/head.

    The interface is `EagleDrafterModel`'s, so trainer, unroll, engine and exports take either: `forward` maps
    (next tokens, features) to output features, `logits` / `draft_logits` read them.
    """

    family = "eagle3"

    def __init__(self, spec: ModelSpec, aux_layers: tuple[int, ...], draft_capacity: int):
        super().__init__()
        if len(aux_layers) < 1:
            raise ValueError("an EAGLE-3 drafter needs at least one target layer to read (aux_layers)")
        if not 1 <= draft_capacity <= spec.vocab_size:
            raise ValueError(f"draft_capacity must be in [1, {spec.vocab_size}], got {draft_capacity}")
        self.spec = eagle3_layer_spec(spec)
        self.aux_layers = tuple(int(i) for i in aux_layers)
        # In the state dict too, so checkpoints, exchanges and exports say which target layers the weights expect.
        self.register_buffer("aux_layer_ids", torch.tensor(self.aux_layers, dtype=torch.long))
        hidden = spec.hidden_size
        self.fc = CpuLayoutLinear(len(self.aux_layers) * hidden, hidden, bias=False)
        self.layer = Eagle3Layer(self.spec)
        self.norm = RMSNorm(hidden, spec.rms_norm_eps)
        self.lm_head = nn.Parameter(torch.zeros(draft_capacity, hidden))  # one row per draft slot
        self._target: tuple[CausalLM, ...] = ()
        self.chosen_vocab: DraftVocab | None = None  # the map the data chose (None before any data)
        self.draft_vocab = _completed(None, spec.vocab_size, draft_capacity)  # its slots: chosen, then filler
        self._register_vocab_buffers()

    @property
    def draft_capacity(self) -> int:
        return self.lm_head.shape[0]

    @property
    def feature_width(self) -> int:
        """Width of the target features the drafter reads (the aux layers' states, concatenated)."""
        return len(self.aux_layers) * self.spec.hidden_size

    @classmethod
    def from_target(
        cls, target: CausalLM, *, draft_capacity: int, aux_layers: tuple[int, ...] | None = None
    ) -> Eagle3DrafterModel:
        """The starting drafter for `target` (see the module docstring). `target` may be the parts a drafter worker
        holds (`load_drafter_parts`): its `source_num_layers` says how deep the real target is."""
        aux = aux_layers or default_aux_layers(target.source_num_layers)
        weight = target.lm_head.weight
        drafter = cls(target.spec, aux, min(draft_capacity, target.spec.vocab_size))
        drafter.to(device=weight.device, dtype=weight.dtype)
        last = target.model.layers[-1]
        hidden = target.spec.hidden_size
        with torch.no_grad():
            qkv = drafter.layer.self_attn.qkv_proj.weight
            qkv.zero_()
            qkv[:, hidden:] = last.self_attn.qkv_proj.weight  # reads the feature; the token's part starts at 0
            if last.self_attn.q_norm is not None:
                drafter.layer.self_attn.q_norm.weight.copy_(last.self_attn.q_norm.weight)
                drafter.layer.self_attn.k_norm.weight.copy_(last.self_attn.k_norm.weight)
            drafter.layer.self_attn.o_proj.weight.zero_()
            drafter.layer.mlp.load_state_dict(last.mlp.state_dict())
            drafter.layer.mlp.down_proj.weight.zero_()
            drafter.layer.hidden_norm.weight.copy_(last.input_layernorm.weight)
            drafter.layer.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
            drafter.norm.weight.copy_(target.model.norm.weight)
            drafter.fc.weight.zero_()
            drafter.fc.weight[:, -hidden:] = torch.eye(hidden, dtype=weight.dtype)
            drafter.lm_head.copy_(weight.index_select(0, drafter.draft_vocab_ids))  # filler slots, from the target
        drafter.attach(target)
        return drafter

    def attach(self, target: CausalLM) -> None:
        """Share the target's embedding (frozen); its layers must include the ones this drafter reads."""
        checked_target(self, target, "EAGLE-3 drafter")
        check_aux_layers(self.aux_layers, target.source_num_layers)
        self._target = (target,)

    @property
    def target(self) -> CausalLM:
        return attached_target(self)

    def input_features(self, captured: torch.Tensor) -> torch.Tensor:
        """The part of a captured target vector the drafter reads: the target emits [final | aux layers] when its
        `feature_layers` are this drafter's (`CausalLM.forward`); [..., n*H] passes through."""
        if captured.shape[-1] == self.feature_width:
            return captured
        if captured.shape[-1] == self.feature_width + self.spec.hidden_size:
            return captured[..., self.spec.hidden_size :]
        raise ValueError(
            f"EAGLE-3 drafter reads {len(self.aux_layers)} target layers ({self.feature_width} values per token), got "
            f"{captured.shape[-1]}: capture the target with feature_layers={list(self.aux_layers)}"
        )

    def split_captured(self, captured: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(the target's final hidden state, or None where the vector has only the aux features; the aux features,
        a compact copy: a slice would keep the final state's memory alive in the data buffer)."""
        features = self.input_features(captured)
        if features is captured:
            return None, captured
        return captured[..., : self.spec.hidden_size], features.contiguous()

    def forward(
        self,
        next_token_ids: torch.Tensor,
        hidden_states: torch.Tensor,
        batch: AttentionBatch,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        """Output features [B, T, H] (before the final norm) from tokens t_{j+1} [B, T] and features at j: the
        target's aux features [B, T, n*H] (fused by fc) or the drafter's own [B, T, H]."""
        embeds = self.target.model.embed_tokens(next_token_ids)
        feature = hidden_states.to(embeds.dtype)
        if feature.shape[-1] != self.spec.hidden_size:
            feature = self.fc(self.input_features(feature))
        return self.layer(embeds, feature, batch, k_cache, v_cache)

    def target_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's own logits [..., V] from a captured vector [final | aux layers] (scores need the final state,
        which the training buffer no longer keeps: score captured samples before adding them)."""
        if hidden.shape[-1] != self.feature_width + self.spec.hidden_size:
            raise ValueError(
                f"the target's logits need its final hidden state: got {hidden.shape[-1]} values per token, expected "
                f"{self.feature_width + self.spec.hidden_size} ([final | aux layers], as captured)"
            )
        return self.target.lm_head(hidden[..., : self.spec.hidden_size])

    def head_input(self, features: torch.Tensor) -> torch.Tensor:
        """What the head reads: the final norm of the features."""
        return self.norm(features)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's whole vocabulary [..., V]: -inf outside the draft slots."""
        draft = self.draft_logits(features)
        full = draft.new_full((*draft.shape[:-1], self.spec.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_vocab_ids, draft)

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the draft slots [..., draft_capacity]: slot s is target token `draft_vocab.ids[s]`."""
        normed = self.head_input(features)
        return F.linear(normed, self.lm_head.to(normed.dtype))

    def draft_head_weight(self) -> torch.Tensor:
        """The head [draft_capacity, H], the drafter's own (trainable)."""
        return self.lm_head

    def drop_derived_weights(self) -> None:
        """Nothing derived is cached (the head is the drafter's own parameter)."""

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        """Draft over `vocab` (the data's map; None: filler alone) from now on. Slots whose token stays keep their row
        (a grown map appends, so trained slots stay); the others start from the target's head rows (when attached)."""
        if vocab is not None:
            if vocab.vocab_size != self.spec.vocab_size:
                raise ValueError(
                    f"a draft vocabulary over {vocab.vocab_size} tokens does not fit a drafter of vocabulary "
                    f"{self.spec.vocab_size}"
                )
            if len(vocab) > self.draft_capacity:
                raise ValueError(
                    f"a draft vocabulary of {len(vocab)} tokens does not fit this EAGLE-3 drafter's head of "
                    f"{self.draft_capacity} rows"
                )
        slots = _completed(vocab, self.spec.vocab_size, self.draft_capacity)
        changed = slots.ids != self.draft_vocab.ids
        if bool(changed.any()) and self._target:
            with torch.no_grad():
                source = self.target.lm_head.weight.detach()
                rows = torch.nonzero(changed).flatten()
                new_rows = source.index_select(0, slots.ids[rows].to(source.device)).to(self.lm_head.dtype)
                self.lm_head.index_copy_(0, rows.to(self.lm_head.device), new_rows.to(self.lm_head.device))
        self.chosen_vocab, self.draft_vocab = vocab, slots
        self._register_vocab_buffers()

    def _register_vocab_buffers(self) -> None:
        """The slots' token ids and how many of them the data chose: in the state dict, so the map travels with the
        head rows it indexes."""
        device = self.fc.weight.device
        chosen = len(self.chosen_vocab) if self.chosen_vocab is not None else 0
        capacity = self.chosen_vocab.capacity if self.chosen_vocab is not None else self.draft_capacity
        self.register_buffer("draft_vocab_ids", self.draft_vocab.ids.to(device))
        self.register_buffer("chosen_vocab_size", torch.tensor(chosen, device=device))
        self.register_buffer("draft_vocab_capacity", torch.tensor(capacity, device=device))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """nn.Module's, plus the map: the state's slots and chosen count are taken before its head rows are copied."""
        state = dict(state_dict)
        saved_layers = state.get("aux_layer_ids")
        if saved_layers is not None and tuple(saved_layers.tolist()) != self.aux_layers:
            raise ValueError(
                f"EAGLE-3 drafter state reads target layers {saved_layers.tolist()}, this drafter "
                f"{list(self.aux_layers)}: build the drafter with the state's layers (drafter.family.drafter_for_state)"
            )
        ids = state.get("draft_vocab_ids")
        if ids is not None:
            if ids.numel() != self.draft_capacity:
                raise ValueError(
                    f"EAGLE-3 drafter state has {ids.numel()} draft slots, this drafter's head {self.draft_capacity}"
                )
            chosen = int(state.get("chosen_vocab_size", ids.numel()))
            capacity = int(state.get("draft_vocab_capacity", self.draft_capacity))
            vocab = DraftVocab(ids[:chosen], self.spec.vocab_size, capacity) if chosen else None
            self.chosen_vocab, self.draft_vocab = vocab, DraftVocab(ids, self.spec.vocab_size, self.draft_capacity)
            self._register_vocab_buffers()
        return super().load_state_dict(state, strict=strict, assign=assign)


def _completed(chosen: DraftVocab | None, vocab_size: int, capacity: int) -> DraftVocab:
    """The draft slots: the chosen map's tokens, then the lowest ids not in it, `capacity` in all."""
    # On the host whatever the default device (a drafter built under torch.device("meta") to count its bytes).
    ids = chosen.ids if chosen is not None else torch.zeros(0, dtype=torch.long, device="cpu")
    taken = torch.zeros(vocab_size, dtype=torch.bool, device="cpu")
    taken[ids] = True
    filler = torch.nonzero(~taken).flatten()[: capacity - ids.numel()]
    return DraftVocab(torch.cat([ids, filler]), vocab_size, capacity)
