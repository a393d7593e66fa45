"""EAGLE-1/2 drafter: one target-architecture decoder layer over [token embedding, target hidden state].

At position j the drafter reads the target's last-layer hidden state h_j (after the final norm, the tensor that
feeds the LM head) and the embedding of the next token t_{j+1}; `fc` fuses the two (2H -> H, embedding first),
one decoder layer (the target's architecture, without its input RMSNorm, as in EAGLE and vLLM's
`EagleLlamaForCausalLM`) predicts h_{j+1}, and the target's own LM head turns that into logits for t_{j+2}.
There is no final norm, matching vLLM's EAGLE-1 drafter, so exported weights of drafters for Qwen2 and Llama
targets load there unchanged. A Qwen3 target's layer has q/k norms, which no vLLM EAGLE-1 layer has: such
drafters work in the torch engine, and vLLM refuses them (see `verl_tlt.drafter.export`).

The target's embedding and LM head are shared by reference and never trained or saved with the drafter.
Decoder modules come from the engine's model file so the drafter's layer is numerically the target's.

With a draft vocabulary (`verl_tlt.drafter.draft_vocab`) the drafter's head is the target's head restricted to
those rows: `draft_logits` covers the draft slots only (training, and the cost drafting pays), and `logits` puts
them back in the full vocabulary with -inf elsewhere, so the engine's verification sees a proper distribution that
is zero outside the draft vocabulary. The map travels in the state dict (`draft_vocab_ids`, `draft_vocab_capacity`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from verl_tlt.drafter.draft_vocab import DraftVocab
from verl_tlt.modeling.cpu_linear import CpuLayoutLinear
from verl_tlt.modeling.model import AttentionBatch, CausalLM, DecoderLayer, ModelSpec


class EagleDrafterModel(nn.Module):
    """Trainable part of an EAGLE drafter (fc + one decoder layer); `attach` binds the frozen target parts."""

    family = "eagle"
    aux_layers: tuple[int, ...] = ()  # target layers read besides the final one (EAGLE-3's; none here)

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.fc = CpuLayoutLinear(2 * spec.hidden_size, spec.hidden_size, bias=False)
        self.layer = DecoderLayer(spec)
        self.layer.input_layernorm = nn.Identity()  # EAGLE drops it: fc's output is not a residual-stream state
        self._target: tuple[CausalLM, ...] = ()  # a tuple keeps the target out of parameters and state_dict
        self.draft_vocab: DraftVocab | None = None  # None: draft over the target's whole vocabulary
        self._draft_head: tuple[tuple, torch.Tensor] | None = None  # (what it was cut from, the head's draft rows)

    @classmethod
    def from_target(cls, target: CausalLM) -> EagleDrafterModel:
        """Initialise from the target: fc passes the target's feature through, and the decoder layer is the target's
        last layer with its two residual branches (attention's o_proj, the MLP's down_proj, and o_proj's bias)
        zeroed, so the untrained drafter outputs the target's feature unchanged.

        Why not the last layer as it is: that layer writes into the residual stream, whose scale on a real model is
        tens of times the final norm's output that the drafter must predict (and that its shared head reads), so a
        plain copy starts with logits hundreds of nats off (measured on SmolLM2: a dense token loss of 470 nats). Zeroed
        branches start the drafter at "the next feature is this one", a sane scale from which its q/k/v and MLP input
        projections, the target's own, are trained; on SmolLM2's warm-up data it reached 3.5x the copy's held-out
        top-1 agreement after 100 steps (docs/benchmarks.md).
        """
        drafter = cls(target.spec).to(device=target.lm_head.weight.device, dtype=target.lm_head.weight.dtype)
        last = {k: v for k, v in target.model.layers[-1].state_dict().items() if not k.startswith("input_layernorm")}
        drafter.layer.load_state_dict(last)
        hidden = target.spec.hidden_size
        with torch.no_grad():
            drafter.fc.weight.zero_()
            drafter.fc.weight[:, hidden:] = torch.eye(hidden, dtype=drafter.fc.weight.dtype)
            for branch in (drafter.layer.self_attn.o_proj, drafter.layer.mlp.down_proj):
                branch.weight.zero_()
                if branch.bias is not None:
                    branch.bias.zero_()
        drafter.attach(target)
        return drafter

    def attach(self, target: CausalLM) -> None:
        """Share the target's embedding and LM head (frozen: the drafter never updates them)."""
        self._target = (checked_target(self, target, "Drafter"),)

    @property
    def target(self) -> CausalLM:
        return attached_target(self)

    @property
    def chosen_vocab(self) -> DraftVocab | None:
        """The map the data chose: the draft vocabulary itself (EAGLE-3 pads its own to a fixed head)."""
        return self.draft_vocab

    @property
    def feature_width(self) -> int:
        """Width of the target features the drafter reads: the final hidden state."""
        return self.spec.hidden_size

    def input_features(self, captured: torch.Tensor) -> torch.Tensor:
        """The part of a captured target vector the drafter reads: all of it (the final hidden state)."""
        if captured.shape[-1] != self.spec.hidden_size:
            raise ValueError(
                f"EAGLE drafter reads the target's final hidden state ({self.spec.hidden_size} values per token), got "
                f"{captured.shape[-1]}"
            )
        return captured

    def split_captured(self, captured: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(the target's final hidden state, what the drafter reads) of a captured vector: both are all of it."""
        return captured, self.input_features(captured)

    def head_input(self, features: torch.Tensor) -> torch.Tensor:
        """What the head reads: the features themselves (EAGLE-1 predicts the target's normed feature)."""
        return features

    def forward(
        self,
        next_token_ids: torch.Tensor,
        hidden_states: torch.Tensor,
        batch: AttentionBatch,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        """Predicted next features [B, T, H] from tokens t_{j+1} [B, T] and features h_j [B, T, H] at positions j."""
        embeds = self.target.model.embed_tokens(next_token_ids)
        fused = self.fc(torch.cat([embeds, hidden_states.to(embeds.dtype)], dim=-1))
        return self.layer(fused, batch, k_cache, v_cache)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's whole vocabulary [..., V]: -inf outside the draft vocabulary, if any."""
        if self.draft_vocab is None:
            return self.target.lm_head(features)
        draft = self.draft_logits(features)  # [..., Vd]
        full = draft.new_full((*draft.shape[:-1], self.spec.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_vocab_ids, draft)

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the draft slots [..., Vd] (slot s is target token `draft_vocab.ids[s]`); [..., V] without a
        draft vocabulary."""
        if self.draft_vocab is None:
            return self.target.lm_head(features)
        return F.linear(features, self.draft_head_weight().to(features.dtype))

    def target_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's own logits [..., V] (its full LM head), e.g. for the teacher's distribution."""
        return self.target.lm_head(hidden)

    def draft_head_weight(self) -> torch.Tensor:
        """The LM head's rows of the draft vocabulary [Vd, H] (the whole head without one), frozen.

        Kept as a copy, rebuilt when the target's weights change (a load bumps its `weights_generation`; an in-place
        update bumps the parameter's version) or the map does.
        """
        weight = self.target.lm_head.weight
        if self.draft_vocab is None:
            return weight
        source = (weight.data_ptr(), _version(weight), self.target.weights_generation, id(self.draft_vocab))
        if self._draft_head is None or self._draft_head[0] != source:
            rows = weight.detach().index_select(0, self.draft_vocab_ids.to(weight.device))
            self._draft_head = (source, rows)
        return self._draft_head[1]

    def drop_derived_weights(self) -> None:
        """Forget the copy of the head's draft rows (rebuilt on next use): after a move to another device, so no copy
        stays behind on the old one."""
        self._draft_head = None

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        """Draft over `vocab` from now on (None: the whole vocabulary)."""
        if vocab is not None and vocab.vocab_size != self.spec.vocab_size:
            raise ValueError(
                f"a draft vocabulary over {vocab.vocab_size} tokens does not fit a drafter of vocabulary "
                f"{self.spec.vocab_size}"
            )
        self.draft_vocab, self._draft_head = vocab, None
        for name in ("draft_vocab_ids", "draft_vocab_capacity"):
            if name in self._buffers:
                del self._buffers[name]
        if vocab is not None:
            device = self.fc.weight.device
            self.register_buffer("draft_vocab_ids", vocab.ids.to(device))
            self.register_buffer("draft_vocab_capacity", torch.tensor(vocab.capacity, device=device))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """nn.Module's, plus the draft vocabulary: a state with `draft_vocab_ids` sets it, one without clears it."""
        state = dict(state_dict)
        ids, capacity = state.get("draft_vocab_ids"), state.get("draft_vocab_capacity")
        if ids is None:
            self.set_draft_vocab(None)
        else:
            size = int(capacity) if capacity is not None else ids.numel()
            self.set_draft_vocab(DraftVocab(ids, self.spec.vocab_size, size))
            state["draft_vocab_capacity"] = torch.tensor(size)
        return super().load_state_dict(state, strict=strict, assign=assign)


def _version(tensor: torch.Tensor) -> int:
    """The tensor's version counter; -1 for an inference tensor, which has none (and cannot change in place)."""
    try:
        return tensor._version
    except RuntimeError:
        return -1


def checked_target(drafter, target: CausalLM, what: str) -> CausalLM:
    """`target`, once its hidden and vocabulary sizes are the drafter's (ValueError naming both otherwise)."""
    if target.spec.hidden_size != drafter.spec.hidden_size or target.spec.vocab_size != drafter.spec.vocab_size:
        raise ValueError(
            f"{what} (hidden {drafter.spec.hidden_size}, vocab {drafter.spec.vocab_size}) does not fit the target "
            f"(hidden {target.spec.hidden_size}, vocab {target.spec.vocab_size})"
        )
    return target


def attached_target(drafter) -> CausalLM:
    """The target a drafter shares modules with (held in a tuple, so it stays out of parameters and state_dict)."""
    if not drafter._target:
        raise RuntimeError(f"{type(drafter).__name__} has no target attached; call attach(target) first")
    return drafter._target[0]
