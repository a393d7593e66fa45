"""The drafter's training loss (EAGLE-1/2): a feature loss and a token loss, averaged over the scored pairs.

hidden_loss: SmoothL1 between the drafter's predicted feature and the target's next feature.
logit_loss: soft cross-entropy of the drafter's next-token distribution q against the target's p.

Two ways to get p. The dense recipe recomputes it at every step with the target's full LM head (a [pairs, vocab]
product and softmax, kept for comparison: `tlt.drafter.teacher_top_k=0`). The sparse recipe reads the labels
computed once per captured token (`verl_tlt.drafter.teacher`: the top-k ids, their log-probs and the rest's mass)
and scores q on the partition {each top-k token, everything else}:

    logit_loss = -sum_{i in top-k} p_i log q_i - rest_mass * log q(not top-k)

which is the dense soft cross-entropy when k covers the vocabulary. With a draft vocabulary q lives on the draft
slots only: top-k tokens outside it cannot be drafted and drop out (as EAGLE-3 restricts the target to its draft
vocabulary), and "everything else" means the draft slots outside the top-k.

The sparse token loss runs in chunks of pairs (`ChunkedTokenLoss`): each chunk's logits exist only while that chunk
is computed, and its gradient is taken there, so peak memory does not grow with the batch's pairs times the
vocabulary, and the head runs twice per step (logits, then the gradient), never for the teacher.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl_tlt.drafter.data import PackedBatch
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.drafter.teacher import TeacherLabels
from verl_tlt.drafter.unroll import unrolled_forward

# Pairs per chunk of the token loss: bounds the live [chunk, draft vocabulary] logits (fp32: 100 MB at 512 x 49k).
LOSS_CHUNK_PAIRS = 512
# A finite stand-in for -inf where a logit is masked: a product with a zero weight stays 0, never NaN.
_MASKED = -1e30


def drafter_losses(
    model: EagleDrafterModel,
    features: torch.Tensor,
    target_hidden: torch.Tensor,
    loss_mask: torch.Tensor,
    labels: TeacherLabels | None = None,
    *,
    chunk_pairs: int = LOSS_CHUNK_PAIRS,
) -> dict[str, torch.Tensor]:
    """Masked means over pairs of hidden_loss, logit_loss and top1_accuracy (the drafter's likeliest token is the
    target's).

    features, target_hidden [1, N, H]; loss_mask [1, N] bool; labels: the target's sparse distribution of each pair's
    predicted token (N positions), or None for the dense recipe (the target's head run here).
    """
    mask = loss_mask.to(features.dtype)
    count = mask.sum().clamp(min=1.0)
    if model.family == "eagle":
        hidden_loss = (F.smooth_l1_loss(features, target_hidden, reduction="none").mean(-1) * mask).sum() / count
    else:  # EAGLE-3's features are its own, not the target's: no feature to compare them with
        hidden_loss = features.new_zeros(())
    if labels is None:
        logit_loss, agree = _dense_token_loss(model, features, target_hidden, mask)
    else:
        weights = (mask / count).flatten().float()
        head_input = model.head_input(features).flatten(0, -2)
        logit_loss, agree = _sparse_token_loss(model, head_input, labels, weights, chunk_pairs)
        logit_loss = logit_loss.to(features.dtype)
    return {"hidden_loss": hidden_loss, "logit_loss": logit_loss, "top1_accuracy": (agree * mask).sum() / count}


def unrolled_losses(
    model: EagleDrafterModel, batch: PackedBatch, input_hidden: torch.Tensor, depth: int, decay: float
) -> dict[str, torch.Tensor]:
    """`drafter_losses` of every depth of the unrolled chain, weighted decay ** (depth - 1) and normalised; the
    top-1 accuracy is depth 1's (comparable with single-depth training)."""
    total: dict[str, torch.Tensor] = {}
    weights = 0.0
    for level, draft in enumerate(unrolled_forward(model, batch, depth, input_hidden), start=1):
        mask = draft.loss_mask(batch.loss_mask)
        labels = batch.teacher.select(draft.target_index) if batch.teacher is not None else None
        losses = drafter_losses(model, draft.features, batch.target_hidden[:, draft.target_index], mask, labels)
        weight = decay ** (level - 1)
        weights += weight
        for key in ("hidden_loss", "logit_loss"):
            total[key] = total.get(key, 0.0) + weight * losses[key]
        if level == 1:
            total["top1_accuracy"] = losses["top1_accuracy"]
    return {
        "hidden_loss": total["hidden_loss"] / weights,
        "logit_loss": total["logit_loss"] / weights,
        "top1_accuracy": total["top1_accuracy"],
    }


def _dense_token_loss(model: EagleDrafterModel, features, target_hidden, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense recipe: the target's distribution from its full head, every step (EAGLE-3: of captured samples only,
    which still hold the final state; `target_logits` says so otherwise)."""
    draft_log_probs = model.draft_logits(features).float().log_softmax(-1)  # [1, N, Vd]
    with torch.no_grad():
        target_logits = model.target_logits(target_hidden).float()  # [1, N, V]
        target_probs = target_logits.softmax(-1)
        if model.draft_vocab is not None:
            target_probs = target_probs[..., model.draft_vocab_ids]  # what the drafter can draft
    logit_loss = (-(target_probs * draft_log_probs).sum(-1) * mask).sum() / mask.sum().clamp(min=1.0)
    agree = (_drafted_token_ids(model, draft_log_probs.argmax(-1)) == target_logits.argmax(-1)).to(features.dtype)
    return logit_loss, agree


def _sparse_token_loss(model: EagleDrafterModel, features, labels: TeacherLabels, weights, chunk_pairs: int):
    """(sum of weights x soft cross-entropy over the pairs, [1, N] top-1 agreement) from sparse labels."""
    labels = labels.to(features.device)
    if model.draft_vocab is None:
        slots = labels.token_ids
    else:
        slots = model.draft_vocab.target_to_draft.to(features.device)[labels.token_ids]  # [N, k], -1 = not draftable
    probs = labels.log_probs.float().exp().masked_fill(slots < 0, 0.0)
    loss, top_slot = ChunkedTokenLoss.apply(
        features, model.draft_head_weight(), slots, probs, labels.rest_mass, weights, chunk_pairs
    )
    agree = _drafted_token_ids(model, top_slot) == labels.token_ids[:, 0]
    return loss, agree.to(features.dtype).unsqueeze(0)


def _drafted_token_ids(model: EagleDrafterModel, slots: torch.Tensor) -> torch.Tensor:
    """Target token ids of draft slots."""
    return slots if model.draft_vocab is None else model.draft_vocab_ids[slots]


def sparse_token_losses(
    features: torch.Tensor,
    head_weight: torch.Tensor,
    slots: torch.Tensor,
    probs: torch.Tensor,
    rest_mass: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair soft cross-entropy [n] and the drafter's likeliest slot [n] (see the module docstring).

    features [n, H]; head_weight [Vd, H]; slots [n, k] (draft slot of each top-k token, -1 = not draftable); probs
    [n, k] (the target's probability of each, 0 where not draftable); rest_mass [n].
    """
    logits = F.linear(features, head_weight.to(features.dtype)).float()  # [n, Vd]
    num_slots = logits.shape[-1]
    log_z = logits.logsumexp(-1, keepdim=True)  # [n, 1]
    # One spare column stands for "not draftable": its logit is masked, and its weight is 0.
    padded = F.pad(logits, (0, 1), value=_MASKED)  # [n, Vd + 1]
    index = torch.where(slots >= 0, slots, num_slots)
    top = (probs * (padded.gather(-1, index) - log_z)).sum(-1)
    others = padded.scatter(-1, index, _MASKED)[:, :num_slots]  # the draft slots outside the top-k
    has_others = (others > _MASKED / 2).any(-1)
    # With no draft slot outside the top-k (k >= the draft vocabulary), the rest's mass is undraftable: no term.
    rest = torch.where(has_others, rest_mass.float(), 0.0) * (others.logsumexp(-1) - log_z.squeeze(-1))
    return -(top + rest), logits.argmax(-1)


class ChunkedTokenLoss(torch.autograd.Function):
    """sum_i weights_i x the soft cross-entropy of `sparse_token_losses`, computed `chunk_pairs` pairs at a time with
    each chunk's gradient worked out on the spot (closed form, below): the [chunk, Vd] logits never exist for the
    whole batch, and backward only scales the stored gradients. Returns (loss, the likeliest slot per pair);
    `features` gets a gradient, and so does the head where it trains (EAGLE-3's own; EAGLE-1's is the target's,
    frozen)."""

    @staticmethod
    def forward(ctx, features, head_weight, slots, probs, rest_mass, weights, chunk_pairs: int):
        grad = torch.zeros_like(features) if features.requires_grad else None
        head_grad = torch.zeros_like(head_weight, dtype=torch.float32) if head_weight.requires_grad else None
        total = torch.zeros((), dtype=torch.float32, device=features.device)
        top_slot = torch.empty(features.shape[0], dtype=torch.long, device=features.device)
        head = head_weight.detach()
        for start in range(0, features.shape[0], chunk_pairs):
            end = min(start + chunk_pairs, features.shape[0])
            part = slice(start, end)
            loss, top_slot[part], logit_grad = _chunk_loss(
                features[part].detach(),
                head,
                slots[part],
                probs[part],
                rest_mass[part],
                weights[part],
                grad is not None or head_grad is not None,
            )
            total += loss
            if grad is not None:
                grad[part] = (logit_grad.to(head.dtype) @ head).to(grad.dtype)
            if head_grad is not None:
                head_grad += logit_grad.t() @ features[part].detach().float()
        empty = torch.zeros(0)
        ctx.save_for_backward(
            grad if grad is not None else empty, head_grad.to(head_weight.dtype) if head_grad is not None else empty
        )
        ctx.has_grads = (grad is not None, head_grad is not None)
        ctx.mark_non_differentiable(top_slot)
        return total, top_slot

    @staticmethod
    def backward(ctx, grad_loss, _grad_top_slot):
        grad, head_grad = ctx.saved_tensors
        has_grad, has_head_grad = ctx.has_grads
        grad = grad * grad_loss.to(grad.dtype) if has_grad else None
        head_grad = head_grad * grad_loss.to(head_grad.dtype) if has_head_grad else None
        return grad, head_grad, None, None, None, None, None


def _chunk_loss(features, head, slots, probs, rest_mass, weights, with_grad: bool):
    """(sum of weights x loss, likeliest slot [n], d(sum)/d logits [n, Vd] or None) for one chunk of pairs.

    With e_v = exp(l_v - max l), Z = sum e, O = Z - sum_{top} e (the draft slots outside the top-k), P = sum_top p:
    loss = -sum_top p_i log(e_i / Z) - r log(O / Z), and its gradient in the logits is
    (P + r) e_v / Z - r e_v / O + [v in top] (r e_v / O - p_v): one pass over the exponentials scales them, and the
    top-k corrections are a scatter of k entries per pair. O comes from a subtraction, so it is kept >= 1e-7 Z (float32
    resolves no less): a drafter surer than that of its top-k reads as that sure. Five passes over [n, Vd] in all.
    """
    logits = F.linear(features, head.to(features.dtype)).float()  # [n, Vd]
    num_slots = logits.shape[-1]
    valid = slots >= 0
    index = slots.clamp(min=0)
    best, top_slot = logits.max(-1)  # [n]
    top_log_e = logits.gather(-1, index) - best.unsqueeze(-1)  # [n, k]: log e of the top-k slots, before exp
    exps = logits.sub_(best.unsqueeze(-1)).exp_()  # [n, Vd], in place
    total = exps.sum(-1)  # Z
    top_exps = top_log_e.exp() * valid
    # Every draft slot a top-k token: the rest's mass has no slot to go to, and drops out.
    has_others = valid.sum(-1) < num_slots
    rest = torch.where(has_others, rest_mass.float(), 0.0)
    others = torch.maximum(total - top_exps.sum(-1), 1e-7 * total)  # O
    log_total = total.log()
    loss = -(probs * (top_log_e - log_total.unsqueeze(-1))).sum(-1) - rest * (others.log() - log_total)
    if not with_grad:
        return (loss * weights).sum(), top_slot, None
    covered = probs.sum(-1)  # P
    scale = weights * ((covered + rest) / total - rest / others)  # [n]
    logit_grad = exps.mul_(scale.unsqueeze(-1))  # reuses the exponentials' memory
    correction = (weights * rest / others).unsqueeze(-1) * top_exps - weights.unsqueeze(-1) * probs
    logit_grad.scatter_add_(-1, index, correction * valid)
    return (loss * weights).sum(), top_slot, logit_grad
