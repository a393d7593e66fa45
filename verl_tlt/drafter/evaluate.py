"""How well a drafter drafts for samples it has not trained on (teacher-forced): the scores behind
`tlt/drafter/eval_*` and `verl-tlt bench drafter-replay`."""

from __future__ import annotations

import torch

from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.drafter.unroll import unrolled_forward

# The shared-noise estimate: draws per position, and their seed (fixed, so two drafters' scores are paired).
COUPLING_DRAWS = 8
COUPLING_SEED = 1234
# Chain depth of the acceptance-length estimates; the trainer's per-step estimate uses it too, so that one and a
# held-out score compare.
ESTIMATE_DEPTH = 4


@torch.no_grad()
def evaluate_drafter(
    model: EagleDrafterModel, samples: list, max_tokens_per_batch: int = 4096, depth: int = ESTIMATE_DEPTH
) -> dict[str, float]:
    """How well `model` drafts for `samples` it has not trained on (teacher-forced, over response positions).

    top1_accuracy: the drafter's argmax equals the target's. accept_prob: the target's probability of the
    drafter's argmax, i.e. the chance a greedy draft token survives speculative sampling at temperature 1 (1 for
    a matching argmax at temperature 0 too, so it is the sharper of the two at T=1). est_acceptance_length: a
    depth-`depth` chain's tokens per verify step if every draft token survived with accept_prob.

    coupled_accept_prob: the chance that the drafter's and the target's Gumbel-max draws at temperature 1 agree
    when they share the noise, which is how the engine's keyed sampling drafts and verifies (1 for a drafter with
    the target's distribution, however flat); a Monte-Carlo estimate over COUPLING_DRAWS seeded draws per position,
    the same draws for every model, so two drafters compare on equal noise. est_coupled_acceptance_length: the
    chain estimate from it.

    chain_acceptance_length: a depth-`depth` keyed chain's tokens per verify step, averaged over every response
    position as a start, with the drafts past the first made from the drafter's own features as at inference
    (`verl_tlt.drafter.unroll`): 1 + the sum over depths of the product of the shared-noise agreements so far. A
    chain that would run past the end of its sample stops there. chain_greedy_acceptance_length: the same for
    greedy drafts accepted with the target's probability of them.
    """
    from verl_tlt.drafter.data import pack, windows

    was_training = model.training
    model.eval()
    device, dtype = model.fc.weight.device, model.fc.weight.dtype
    pairs = agree = accept = coupled = 0.0
    noise_generator = torch.Generator().manual_seed(COUPLING_SEED)
    chunk: list = []
    chunks: list[list] = []
    # Long samples in windows, as in training: a packed batch's attention is quadratic in its length.
    for sample in (piece for whole in samples for piece in windows(whole, max_tokens_per_batch)):
        if chunk and sum(s.num_tokens for s in chunk) + sample.num_tokens > max_tokens_per_batch:
            chunks.append(chunk)
            chunk = []
        chunk.append(sample)
    if chunk:
        chunks.append(chunk)
    chain_coupled = chain_greedy = 0.0
    for part in chunks:
        batch = pack(part).to(device, dtype)
        mask = batch.loss_mask
        target_probs = model.target_logits(batch.target_hidden).float().softmax(-1)
        # Each start's chain along its response: survival of every depth so far, under keyed and greedy drafting.
        alive_coupled = alive_greedy = mask.float()
        chain_coupled += float(alive_coupled.sum())  # the verify step's own token
        chain_greedy += float(alive_greedy.sum())
        for level, drafted in enumerate(unrolled_forward(model, batch, depth), start=1):
            logits = model.logits(drafted.features)
            probs = target_probs[:, drafted.target_index]
            reachable = drafted.loss_mask(mask).float()
            greedy = probs.gather(-1, logits.argmax(-1, keepdim=True)).squeeze(-1) * reachable
            shared = _coupled_agreement(logits, probs, noise_generator) * reachable
            if level == 1:
                agree += float(((logits.argmax(-1) == probs.argmax(-1)) & mask).sum())
                accept += float((greedy * mask).sum())
                coupled += float((shared * mask).sum())
            alive_coupled, alive_greedy = alive_coupled * shared, alive_greedy * greedy
            chain_coupled += float(alive_coupled.sum())
            chain_greedy += float(alive_greedy.sum())
        pairs += float(mask.sum())
    model.train(was_training)
    if not pairs:
        return {}
    accept_prob = accept / pairs
    return {
        "top1_accuracy": agree / pairs,
        "accept_prob": accept_prob,
        "est_acceptance_length": estimated_acceptance_length(accept_prob, depth),
        "coupled_accept_prob": coupled / pairs,
        "est_coupled_acceptance_length": estimated_acceptance_length(coupled / pairs, depth),
        "chain_acceptance_length": chain_coupled / pairs,
        "chain_greedy_acceptance_length": chain_greedy / pairs,
        "num_pairs": pairs,
    }


def _coupled_agreement(draft_logits: torch.Tensor, target_probs: torch.Tensor, generator: torch.Generator):
    """[1, N]: the share of COUPLING_DRAWS shared-noise Gumbel-max draws on which drafter and target pick alike."""
    shape = (COUPLING_DRAWS, *target_probs.shape)
    uniform = torch.rand(shape, generator=generator).clamp_(min=1e-20).to(target_probs.device)
    gumbel = -torch.log(-torch.log(uniform))
    draft_pick = (draft_logits.float().log_softmax(-1) + gumbel).argmax(-1)
    target_pick = (target_probs.clamp(min=1e-30).log() + gumbel).argmax(-1)
    return (draft_pick == target_pick).float().mean(0)


def estimated_acceptance_length(accuracy: float, depth: int) -> float:
    """Tokens per verify step (incl. bonus) of a depth-`depth` chain if each draft is right with p = accuracy.

    (1 - p^(k+1)) / (1 - p) (Leviathan et al.); optimistic for EAGLE, whose later drafts read its own features.
    """
    if accuracy >= 1.0:
        return float(depth + 1)
    return (1.0 - accuracy ** (depth + 1)) / (1.0 - accuracy)
