"""Sparse teacher labels: the target's next-token distribution, top-k plus the rest's mass, computed once."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.drafter.data import DrafterSample, pack
from verl_tlt.drafter.teacher import TeacherLabels, teacher_labels


def head_and_hidden(vocab: int = 50, hidden: int = 8, tokens: int = 12, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, hidden, generator=generator), torch.randn(tokens, hidden, generator=generator)


def test_labels_are_the_top_k_of_the_heads_distribution_and_the_rest_is_the_mass_left():
    head, hidden = head_and_hidden()
    labels = teacher_labels(hidden, head, 5)
    log_probs = (hidden @ head.T).log_softmax(-1)
    expected_log_probs, expected_ids = log_probs.topk(5, dim=-1)
    assert torch.equal(labels.token_ids, expected_ids)
    assert torch.allclose(labels.log_probs, expected_log_probs, atol=1e-6)
    assert torch.allclose(labels.rest_mass, 1 - expected_log_probs.exp().sum(-1), atol=1e-6)
    assert (labels.log_probs[:, :-1] >= labels.log_probs[:, 1:]).all()  # likeliest first


def test_with_k_at_the_vocabulary_nothing_is_left_over_and_k_is_capped():
    head, hidden = head_and_hidden(vocab=20)
    labels = teacher_labels(hidden, head, 64)
    assert labels.top_k == 20
    assert torch.all(labels.rest_mass == 0)
    assert torch.allclose(labels.log_probs.exp().sum(-1), torch.ones(12), atol=1e-5)


def test_the_chunk_size_does_not_change_the_labels():
    head, hidden = head_and_hidden(tokens=37)
    whole = teacher_labels(hidden, head, 7, chunk_tokens=1000)
    chunked = teacher_labels(hidden, head, 7, chunk_tokens=5)
    assert torch.equal(whole.token_ids, chunked.token_ids)
    assert torch.allclose(whole.log_probs, chunked.log_probs) and torch.allclose(whole.rest_mass, chunked.rest_mass)


def test_a_tiny_rest_is_kept_exactly_not_lost_to_rounding():
    head = torch.zeros(10, 1)
    head[0, 0] = 30.0  # token 0 takes all but ~1e-12 of the mass
    labels = teacher_labels(torch.ones(1, 1), head, 1)
    assert 0 < float(labels.rest_mass[0]) < 1e-10


def test_a_packed_batch_carries_each_pairs_labels_of_the_predicted_position():
    head, hidden = head_and_hidden(tokens=6)
    samples = []
    for start, end in ((0, 4), (4, 6)):
        part = hidden[start:end]
        sample = DrafterSample(torch.arange(end - start), part, torch.ones(end - start, dtype=torch.bool))
        samples.append(sample.labelled(teacher_labels(part, head, 3)))
    batch = pack(samples)
    # Pair j's target feature is h_{j+1}: its labels are position j + 1's.
    expected = TeacherLabels.cat([s.teacher.window(1, s.num_tokens) for s in samples])
    assert batch.teacher is not None and torch.equal(batch.teacher.token_ids, expected.token_ids)
    assert batch.teacher.num_positions == batch.num_pairs


def test_a_batch_with_an_unlabelled_sample_has_no_labels_and_mixed_k_is_refused():
    head, hidden = head_and_hidden(tokens=4)
    plain = DrafterSample(torch.arange(4), hidden, torch.ones(4, dtype=torch.bool))
    assert pack([plain, plain.labelled(teacher_labels(hidden, head, 3))]).teacher is None
    with pytest.raises(ValueError, match="different teacher top-k"):
        pack([plain.labelled(teacher_labels(hidden, head, 3)), plain.labelled(teacher_labels(hidden, head, 2))])


def test_labelled_samples_round_trip_through_their_fields_and_bad_shapes_are_named():
    head, hidden = head_and_hidden(tokens=4)
    sample = DrafterSample(torch.arange(4), hidden, torch.ones(4, dtype=torch.bool), 3)
    sample = sample.labelled(teacher_labels(hidden, head, 3))
    back = DrafterSample.from_fields(sample.fields())
    assert torch.equal(back.teacher.token_ids, sample.teacher.token_ids) and back.step == 3
    broken = (*sample.fields()[:6], torch.zeros(2))
    with pytest.raises(ValueError, match="buffer/samples/7: TeacherLabels needs one rest_mass per position"):
        DrafterSample.from_fields(broken, "buffer/samples/7")
