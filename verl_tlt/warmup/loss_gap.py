"""How far the sparse teacher's token loss is from the dense one, measured once at the start of a warm-up.

The sparse labels keep the target's top-k tokens and fold the rest into one bucket (`verl_tlt.drafter.teacher`);
the loss the drafter trains on then differs from the dense soft cross-entropy by how the rest's mass is split. On the
first batch, with the drafter as it starts, both are computed (the dense one with the target's head, once) and
reported, with the mass the top-k hold: what `tlt.drafter.teacher_top_k` costs in fidelity on this target's data.
"""

from __future__ import annotations

import torch

from verl_tlt.drafter.data import DrafterSample, pack, windows
from verl_tlt.drafter.losses import drafter_losses
from verl_tlt.drafter.trainer import DrafterTrainer, drafter_forward


@torch.no_grad()
def teacher_loss_gap(trainer: DrafterTrainer, samples: list[DrafterSample]) -> dict[str, float]:
    """{dense_logit_loss, sparse_logit_loss, top_k_mass, top_k, pairs} on the first batch's worth of `samples`."""
    budget = trainer.config.max_tokens_per_batch
    chosen, used = [], 0
    for piece in (p for sample in samples for p in windows(sample, budget)):
        if used + piece.num_tokens > budget and chosen:
            break
        chosen.append(piece)
        used += piece.num_tokens
    if not chosen or any(sample.teacher is None for sample in chosen):
        return {}
    model = trainer.model
    was_training = model.training
    model.eval()
    batch = pack(chosen).to(trainer.device, trainer.dtype)
    features = drafter_forward(model, batch, batch.input_hidden)
    dense = drafter_losses(model, features, batch.target_hidden, batch.loss_mask)
    sparse = drafter_losses(model, features, batch.target_hidden, batch.loss_mask, batch.teacher)
    model.train(was_training)
    mask = batch.loss_mask[0]
    return {
        "dense_logit_loss": float(dense["logit_loss"]),
        "sparse_logit_loss": float(sparse["logit_loss"]),
        "top_k_mass": float((1 - batch.teacher.rest_mass.to(mask.device))[mask].mean()),
        "top_k": float(batch.teacher.top_k),
        "pairs": float(mask.sum()),
    }
