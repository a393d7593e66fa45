"""The draft vocabulary: chosen by frequency, grown by appending, and drafted over losslessly by the model."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.drafter.data import DrafterSample
from verl_tlt.drafter.draft_vocab import DraftVocab, response_token_counts
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.modeling.weights import load_pretrained, load_weights


@pytest.fixture()
def target(tiny_qwen2):
    model, _ = load_pretrained(str(tiny_qwen2[0]))
    return model.requires_grad_(False)


def counts_of(pairs: dict[int, int], vocab: int = 10) -> torch.Tensor:
    counts = torch.zeros(vocab, dtype=torch.long)
    for token, count in pairs.items():
        counts[token] = count
    return counts


def test_the_most_frequent_tokens_come_first_ties_by_lower_id_and_only_seen_ones():
    vocab = DraftVocab.from_counts(counts_of({7: 5, 2: 9, 4: 5, 9: 1}), capacity=3)
    assert vocab.ids.tolist() == [2, 4, 7]
    assert vocab.target_to_draft.tolist() == [-1, -1, 0, -1, 1, -1, -1, 2, -1, -1]
    assert DraftVocab.from_counts(counts_of({3: 1}), capacity=5).ids.tolist() == [3]


def test_growing_appends_so_every_token_keeps_its_slot_and_stops_at_the_capacity():
    vocab = DraftVocab.from_counts(counts_of({1: 3, 5: 2}), capacity=4)
    grown = vocab.grown(counts_of({8: 10, 5: 50, 6: 4, 0: 1}))
    assert grown.ids.tolist() == [1, 5, 8, 6]  # the old slots first, in place; then the new by frequency
    assert grown.grown(counts_of({2: 100})) is grown  # full
    assert vocab.grown(counts_of({1: 7})) is vocab  # nothing new


def test_the_miss_share_counts_tokens_outside_the_map():
    vocab = DraftVocab(torch.tensor([1, 2]), vocab_size=10, capacity=2)
    assert vocab.miss_share(torch.tensor([1, 2, 3, 4])) == 0.5
    assert vocab.miss_share(torch.tensor([], dtype=torch.long)) == 0.0


def test_response_tokens_only_are_counted():
    sample = DrafterSample(torch.tensor([3, 3, 4, 4]), torch.zeros(4, 2), torch.tensor([False, False, True, True]))
    assert response_token_counts([sample], 6).tolist() == [0, 0, 0, 0, 2, 0]


@pytest.mark.parametrize(
    "ids, capacity, message",
    [([], 4, "at least one token"), ([1, 1], 4, "distinct"), ([1, 12], 4, r"in \[0, 10\)"), ([1, 2, 3], 2, "capacity")],
)
def test_bad_maps_are_refused(ids, capacity, message):
    with pytest.raises(ValueError, match=message):
        DraftVocab(torch.tensor(ids, dtype=torch.long), vocab_size=10, capacity=capacity)


def test_logits_are_the_heads_on_the_draft_vocabulary_and_minus_infinity_elsewhere(target):
    drafter = EagleDrafterModel.from_target(target)
    vocab_size = drafter.spec.vocab_size
    ids = torch.tensor([5, 0, 17, 3])
    drafter.set_draft_vocab(DraftVocab(ids, vocab_size, capacity=8))
    features = torch.randn(2, 3, drafter.spec.hidden_size)
    full = target.lm_head(features)
    logits = drafter.logits(features)
    assert torch.allclose(logits[..., ids], full[..., ids], atol=1e-6)
    outside = torch.ones(vocab_size, dtype=torch.bool)
    outside[ids] = False
    assert torch.isneginf(logits[..., outside]).all()
    assert torch.allclose(drafter.draft_logits(features), full[..., ids], atol=1e-6)
    probs = logits.softmax(-1)  # a proper distribution over the full vocabulary
    assert torch.allclose(probs.sum(-1), torch.ones(2, 3)) and (probs[..., outside] == 0).all()


def test_the_draft_head_follows_a_weight_load_into_the_target(target):
    drafter = EagleDrafterModel.from_target(target)
    drafter.set_draft_vocab(DraftVocab(torch.tensor([2, 4]), drafter.spec.vocab_size, capacity=2))
    features = torch.randn(1, drafter.spec.hidden_size)
    before = drafter.draft_logits(features)
    head = target.lm_head.weight
    name = "lm_head.weight" if not target.spec.tie_word_embeddings else "model.embed_tokens.weight"
    load_weights(target, [(name, head.detach() * 2)], strict=False)  # writes through .data
    assert torch.allclose(drafter.draft_logits(features), 2 * before, atol=1e-5)


def test_the_map_travels_in_the_state_dict_and_a_state_without_one_clears_it(target):
    drafter = EagleDrafterModel.from_target(target)
    drafter.set_draft_vocab(DraftVocab(torch.tensor([9, 1, 4]), drafter.spec.vocab_size, capacity=6))
    state = drafter.state_dict()
    copy = EagleDrafterModel.from_target(target)
    copy.load_state_dict(state)
    assert copy.draft_vocab.ids.tolist() == [9, 1, 4] and copy.draft_vocab.capacity == 6
    plain = EagleDrafterModel.from_target(target).state_dict()
    copy.load_state_dict(plain)
    assert copy.draft_vocab is None and "draft_vocab_ids" not in copy.state_dict()


def test_an_export_keeps_the_map_beside_the_weights_vllm_loads_and_a_bad_map_is_named(target, tmp_path):
    import json

    from verl_tlt.drafter.export import DRAFT_VOCAB_FILE, WEIGHTS_FILE, export_eagle
    from verl_tlt.drafter.load import load_eagle

    drafter = EagleDrafterModel.from_target(target)
    drafter.set_draft_vocab(DraftVocab(torch.tensor([8, 2, 5]), drafter.spec.vocab_size, capacity=4))
    out = export_eagle(drafter, tmp_path / "export")
    from safetensors.torch import load_file

    assert not any("draft_vocab" in name for name in load_file(str(out / WEIGHTS_FILE)))  # vLLM's file stays EAGLE-1
    back = load_eagle(out, target)
    assert back.draft_vocab.ids.tolist() == [8, 2, 5] and back.draft_vocab.capacity == 4
    (out / DRAFT_VOCAB_FILE).write_text(json.dumps({"ids": [1, 1], "capacity": 4}))
    with pytest.raises(ValueError, match="draft_vocab.json is not a draft vocabulary of this target"):
        load_eagle(out, target)
