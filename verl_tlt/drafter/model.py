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
"""

from __future__ import annotations

import torch
from torch import nn

from verl_tlt.modeling.cpu_linear import CpuLayoutLinear
from verl_tlt.modeling.model import AttentionBatch, CausalLM, DecoderLayer, ModelSpec


class EagleDrafterModel(nn.Module):
    """Trainable part of an EAGLE drafter (fc + one decoder layer); `attach` binds the frozen target parts."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.fc = CpuLayoutLinear(2 * spec.hidden_size, spec.hidden_size, bias=False)
        self.layer = DecoderLayer(spec)
        self.layer.input_layernorm = nn.Identity()  # EAGLE drops it: fc's output is not a residual-stream state
        self._target: tuple[CausalLM, ...] = ()  # a tuple keeps the target out of parameters and state_dict

    @classmethod
    def from_target(cls, target: CausalLM) -> EagleDrafterModel:
        """Initialise from the target: decoder layer = the target's last layer, fc passes the hidden state through.

        With fc = [0 | I] the untrained drafter applies the target's last layer to the target's final feature: a
        usable start (better than random) that training then corrects.
        """
        drafter = cls(target.spec).to(device=target.lm_head.weight.device, dtype=target.lm_head.weight.dtype)
        last = {k: v for k, v in target.model.layers[-1].state_dict().items() if not k.startswith("input_layernorm")}
        drafter.layer.load_state_dict(last)
        hidden = target.spec.hidden_size
        with torch.no_grad():
            drafter.fc.weight.zero_()
            drafter.fc.weight[:, hidden:] = torch.eye(hidden, dtype=drafter.fc.weight.dtype)
        drafter.attach(target)
        return drafter

    def attach(self, target: CausalLM) -> None:
        """Share the target's embedding and LM head (frozen: the drafter never updates them)."""
        if target.spec.hidden_size != self.spec.hidden_size or target.spec.vocab_size != self.spec.vocab_size:
            raise ValueError(
                f"Drafter (hidden {self.spec.hidden_size}, vocab {self.spec.vocab_size}) does not fit the target "
                f"(hidden {target.spec.hidden_size}, vocab {target.spec.vocab_size})"
            )
        self._target = (target,)

    @property
    def target(self) -> CausalLM:
        if not self._target:
            raise RuntimeError("EagleDrafterModel has no target attached; call attach(target) first")
        return self._target[0]

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
        return self.target.lm_head(features)
