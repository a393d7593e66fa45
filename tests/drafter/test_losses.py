"""The drafter's token loss from sparse teacher labels: the dense loss when k covers the vocabulary, the same in
chunks, and a gradient equal to autograd's."""

from __future__ import annotations

import math

import pytest
import torch

from verl_tlt.drafter.data import DrafterSample, pack
from verl_tlt.drafter.draft_vocab import DraftVocab
from verl_tlt.drafter.losses import ChunkedTokenLoss, drafter_losses, sparse_token_losses
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.drafter.teacher import teacher_labels
from verl_tlt.drafter.trainer import drafter_forward
from verl_tlt.modeling.weights import load_pretrained


@pytest.fixture(scope="module")
def setup(varied_qwen2):
    """A drafter moved off its start, and a packed batch of labelled samples whose hidden states are the target's
    head inputs (random, but with the target's scale)."""
    target, _ = load_pretrained(str(varied_qwen2[0]))
    target.requires_grad_(False)
    generator = torch.Generator().manual_seed(0)
    vocab, hidden = target.spec.vocab_size, target.spec.hidden_size
    samples = []
    for length in (9, 14, 6):
        ids = torch.randint(vocab, (length,), generator=generator)
        states = torch.randn(length, hidden, generator=generator)
        response = torch.arange(length) >= 2
        samples.append(DrafterSample(ids, states, response))
    torch.manual_seed(1)
    drafter = EagleDrafterModel.from_target(target)
    with torch.no_grad():
        for param in drafter.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return target, drafter, samples


def losses_and_grads(drafter, samples, top_k: int | None, chunk_pairs: int = 512):
    head = drafter.target.lm_head.weight
    labelled = [s.labelled(teacher_labels(s.hidden_states, head, top_k)) for s in samples] if top_k else samples
    batch = pack(labelled)
    drafter.zero_grad(set_to_none=True)
    features = drafter_forward(drafter, batch, batch.input_hidden)
    losses = drafter_losses(
        drafter, features, batch.target_hidden, batch.loss_mask, batch.teacher, chunk_pairs=chunk_pairs
    )
    losses["logit_loss"].backward()
    grads = {name: p.grad.clone() for name, p in drafter.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in losses.items()}, grads


def assert_same(a, b, atol=1e-5):
    (losses_a, grads_a), (losses_b, grads_b) = a, b
    for key in ("logit_loss", "top1_accuracy", "hidden_loss"):
        assert torch.allclose(losses_a[key], losses_b[key], atol=atol), (key, losses_a[key], losses_b[key])
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=atol, rtol=1e-4), name


def test_with_k_at_the_vocabulary_the_sparse_loss_is_the_dense_one(setup):
    target, drafter, samples = setup
    drafter.set_draft_vocab(None)
    assert_same(losses_and_grads(drafter, samples, None), losses_and_grads(drafter, samples, target.spec.vocab_size))


def test_with_a_draft_vocabulary_too(setup):
    target, drafter, samples = setup
    drafter.set_draft_vocab(DraftVocab(torch.arange(0, target.spec.vocab_size, 3), target.spec.vocab_size, 64))
    try:
        dense = losses_and_grads(drafter, samples, None)
        assert_same(dense, losses_and_grads(drafter, samples, target.spec.vocab_size))
    finally:
        drafter.set_draft_vocab(None)


def test_chunks_change_nothing(setup):
    _, drafter, samples = setup
    assert_same(losses_and_grads(drafter, samples, 8, chunk_pairs=3), losses_and_grads(drafter, samples, 8))


def test_a_small_k_gives_a_different_but_close_loss(setup):
    """The (k + 1)-way partition loses the split of the rest: the loss moves, its gradient points the same way."""
    target, drafter, samples = setup
    dense, small = losses_and_grads(drafter, samples, None), losses_and_grads(drafter, samples, 4)
    assert not torch.allclose(dense[0]["logit_loss"], small[0]["logit_loss"])
    flat_dense = torch.cat([g.flatten() for g in dense[1].values()])
    flat_small = torch.cat([g.flatten() for g in small[1].values()])
    assert float(torch.nn.functional.cosine_similarity(flat_dense, flat_small, dim=0)) > 0.5


def test_the_chunked_gradient_is_autograds():
    generator = torch.Generator().manual_seed(3)
    features = torch.randn(7, 5, generator=generator, requires_grad=True)
    head = torch.randn(11, 5, generator=generator)
    slots = torch.tensor([[0, 3], [2, -1], [10, 4], [1, 2], [5, 6], [7, -1], [9, 8]])
    probs = torch.rand(7, 2, generator=generator).masked_fill(slots < 0, 0.0) * 0.5
    rest = torch.rand(7, generator=generator) * 0.5
    weights = torch.rand(7, generator=generator)
    direct, direct_top = sparse_token_losses(features, head, slots, probs, rest)
    (direct * weights).sum().backward()
    expected = features.grad.clone()
    features.grad = None
    loss, top = ChunkedTokenLoss.apply(features, head, slots, probs, rest, weights, 2)
    (3.0 * loss).backward()
    assert torch.allclose(loss, (direct * weights).sum()) and torch.equal(top, direct_top)
    assert torch.allclose(features.grad, 3.0 * expected, atol=1e-6)


def test_the_partition_loss_by_hand():
    """Logits (0, ln 2, ln 3) over three slots: q = (1/6, 2/6, 3/6). Top-1 is slot 2 with p = 0.7, rest 0.3:
    loss = -0.7 ln(3/6) - 0.3 ln(1/6 + 2/6)."""
    head = torch.eye(3)
    features = torch.tensor([[0.0, math.log(2), math.log(3)]])
    args = (features, head, torch.tensor([[2]]), torch.tensor([[0.7]]), torch.tensor([0.3]))
    expected = -0.7 * math.log(0.5) - 0.3 * math.log(0.5)
    loss, top = sparse_token_losses(*args)
    assert math.isclose(float(loss[0]), expected, rel_tol=1e-6) and int(top[0]) == 2
    chunked, chunked_top = ChunkedTokenLoss.apply(*args, torch.ones(1), 4)
    assert math.isclose(float(chunked), expected, rel_tol=1e-6) and int(chunked_top[0]) == 2


def test_undraftable_top_tokens_drop_out_and_a_rest_with_nowhere_to_go_adds_nothing():
    head = torch.eye(2)
    features = torch.tensor([[0.0, 0.0]])
    # Slot 0 holds p = 0.5; a top token outside the draft vocabulary (-1) is dropped; every slot is a top token,
    # so the rest's 0.2 has no slot to go to.
    args = (features, head, torch.tensor([[0, -1, 1]]), torch.tensor([[0.5, 0.0, 0.3]]), torch.tensor([0.2]))
    loss, _ = sparse_token_losses(*args)
    assert math.isclose(float(loss[0]), -(0.5 + 0.3) * math.log(0.5), rel_tol=1e-6)
    features.requires_grad_(True)
    chunked, _ = ChunkedTokenLoss.apply(*args, torch.ones(1), 4)
    chunked.backward()
    assert math.isclose(float(chunked.detach()), float(loss[0]), rel_tol=1e-6) and torch.isfinite(features.grad).all()
