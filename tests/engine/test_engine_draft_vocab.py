"""Speculative decoding with an EAGLE drafter that drafts over a draft vocabulary: outputs are the plain path's.

The drafter never proposes a token outside its map (its distribution is zero there), and verification runs over
the full vocabulary, so greedy and keyed outputs are token-identical to plain decoding, and rejection sampling keeps
the target's distribution, even when the target's likeliest tokens are missing from the map.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.test_engine_speculative import two_token_target_probs
from tests.spec.sd_harness import chi_square_pvalue
from verl_tlt.drafter.draft_vocab import DraftVocab
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.config import SAMPLING_MODES
from verl_tlt.engine.drafts.eagle import EagleDrafter
from verl_tlt.spec import verify as verify_module

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20], [21], [30, 31, 32]]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def draft_vocab_engine(path, ids, *, seed: int = 0, **kwargs) -> RolloutEngine:
    """An engine whose EAGLE drafter (moved off its start) drafts over target tokens `ids` only."""
    engine = RolloutEngine.from_pretrained(str(path), **kwargs)
    model = EagleDrafterModel.from_target(engine.model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # away from the start (zeroed residual branches), so the layer attends and mixes
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    model.set_draft_vocab(DraftVocab(torch.tensor(ids), model.spec.vocab_size, capacity=len(ids)))
    engine.set_drafter(EagleDrafter(model, max_len=engine.cache.max_len))
    return engine


def half_of_the_plain_outputs_tokens(outputs) -> list[int]:
    """Every other distinct token the plain run produced: the map misses half of what the target says."""
    seen = sorted({token for output in outputs for token in output.token_ids})
    return seen[::2]


@pytest.mark.parametrize("strategy", ["4_1_4", "3_3_8", "5_2_10"])
def test_greedy_sd_over_a_draft_vocabulary_is_token_identical_to_plain(varied_qwen2, strategy):
    path = varied_qwen2[0]
    plain = RolloutEngine.from_pretrained(str(path), max_num_seqs=3).generate(PROMPTS, GREEDY)
    engine = draft_vocab_engine(path, half_of_the_plain_outputs_tokens(plain), max_num_seqs=3)
    outputs = engine.generate(PROMPTS, GREEDY, strategy=strategy)
    for sd, ref in zip(outputs, plain, strict=True):
        assert sd.token_ids == ref.token_ids
        assert torch.allclose(torch.tensor(sd.log_probs), torch.tensor(ref.log_probs), atol=1e-5)
    stats = [o.stats for o in outputs]
    assert sum(s["num_verify_steps"] for s in stats) > 0
    assert sum(s.get("num_accepted_tokens", 0) for s in stats) > 0  # the map's tokens are drafted and accepted


def test_keyed_sampled_sd_over_a_draft_vocabulary_is_token_identical_to_plain(varied_qwen2):
    path = varied_qwen2[0]
    params = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=5)
    plain = RolloutEngine.from_pretrained(str(path), max_num_seqs=3, sampling="keyed").generate(PROMPTS, params)
    engine = draft_vocab_engine(path, half_of_the_plain_outputs_tokens(plain), max_num_seqs=3, sampling="keyed")
    outputs = engine.generate(PROMPTS, params, strategy="3_3_8")
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]


def draft_vocab_distribution_pvalue(tmp_path, strategy: str, sampling: str) -> float:
    """Chi-square p-value of the first two tokens of 3000 SD samples against the exact target, with a drafter whose
    map lacks two of the six tokens (among them the target's likeliest first token)."""
    from tests.engine.conftest import build_tiny_model

    vocab, prompt = 6, [1, 4, 2]
    hf_model = build_tiny_model("qwen2", tmp_path, seed=1, vocab_size=vocab, weight_std=0.3)
    with torch.no_grad():
        likeliest = int(hf_model(torch.tensor([prompt])).logits[0, -1].argmax())
    ids = [t for t in range(vocab) if t != likeliest][:4]
    engine = draft_vocab_engine(tmp_path, ids, max_num_seqs=1000, sampling=sampling)
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=2, ignore_eos=True)
    outputs = engine.generate([prompt] * 3000, params, strategy=strategy)
    assert sum(o.stats["num_verify_steps"] for o in outputs) > 0
    samples = torch.tensor([o.token_ids for o in outputs])
    return chi_square_pvalue(samples, two_token_target_probs(hf_model, prompt, vocab), vocab)


@pytest.mark.parametrize("sampling", SAMPLING_MODES)
@pytest.mark.parametrize("strategy", ["3_1_3", "3_2_5"])
def test_sampled_sd_over_a_draft_vocabulary_keeps_the_targets_distribution(tmp_path, strategy, sampling):
    assert draft_vocab_distribution_pvalue(tmp_path, strategy, sampling) > 1e-3  # 0.1% false alarms per seed


@pytest.mark.parametrize("strategy", ["3_1_3", "3_2_5"])
def test_the_distribution_test_catches_a_verifier_that_ignores_the_residual(tmp_path, strategy, monkeypatch):
    monkeypatch.setattr(verify_module, "_reject", lambda residual, token, draft_probs: residual)
    assert draft_vocab_distribution_pvalue(tmp_path, strategy, "rejection") < 1e-6
