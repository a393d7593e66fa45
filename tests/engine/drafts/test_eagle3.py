"""An EAGLE-3 drafter in the engine: the fused inference path computes the model's forward, the target hands it the
right layers, and speculative decoding with it stays exact (greedy and keyed identity, the sampled distribution)."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import build_tiny_model
from tests.engine.test_engine_speculative import two_token_target_probs
from tests.spec.sd_harness import chi_square_pvalue
from verl_tlt.drafter.draft_vocab import DraftVocab
from verl_tlt.drafter.eagle3_model import Eagle3DrafterModel
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.config import SAMPLING_MODES
from verl_tlt.engine.drafts.base import DraftContext
from verl_tlt.engine.drafts.eagle import EagleDrafter
from verl_tlt.modeling.model import AttentionBatch
from verl_tlt.spec import verify as verify_module

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20], [21], [30, 31, 32]]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "llama"])
def deep_target(request, tmp_path_factory):
    """A 5-layer tiny target (so three distinct feature layers exist) whose greedy outputs vary with the context."""
    path = tmp_path_factory.mktemp(f"deep_{request.param}")
    return path, build_tiny_model(request.param, path, weight_std=0.2, num_layers=5)


def eagle3_drafter(engine: RolloutEngine, ids=None, seed: int = 0) -> EagleDrafter:
    """An EAGLE-3 drafter moved off its start (so every weight matters), drafting over `ids` (default: all tokens)."""
    model = Eagle3DrafterModel.from_target(engine.model, draft_capacity=engine.model.spec.vocab_size)
    ids = list(range(model.spec.vocab_size)) if ids is None else ids
    model.set_draft_vocab(DraftVocab(torch.tensor(ids), model.spec.vocab_size, capacity=model.draft_capacity))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return EagleDrafter(model, max_len=engine.cache.max_len)


def close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    return torch.allclose(actual, expected, rtol=1e-5, atol=1e-4)


def reference_features(model: Eagle3DrafterModel, tokens: list[int], hidden: list[torch.Tensor]) -> torch.Tensor:
    """Drafter outputs [T, H] for pairs (hidden[j], tokens[j]) at positions 0..T-1 through the training module path,
    causal, no cache reuse; hidden[j] is a target vector or a drafter feature (widths differ, so one by one)."""
    length = len(tokens)
    spec = model.spec
    k = torch.zeros(1, spec.num_kv_heads, length, spec.head_dim)
    v = torch.zeros_like(k)
    outputs = []
    with torch.no_grad():
        for j in range(length):
            position = torch.tensor([[j]])
            cos, sin = model.target.rotary_tables(position, torch.float32)
            mask = (torch.arange(length) <= j).view(1, 1, 1, length)
            batch = AttentionBatch(row_start=0, write_pos=position, attn_mask=mask, cos=cos, sin=sin)
            outputs.append(model(torch.tensor([[tokens[j]]]), hidden[j].view(1, 1, -1), batch, k, v)[0, 0])
    return torch.stack(outputs)


def test_the_target_appends_the_drafters_layers_as_transformers_counts_them(deep_target):
    path, hf_model = deep_target
    engine = RolloutEngine.from_pretrained(str(path))
    drafter = eagle3_drafter(engine)
    assert drafter.model.aux_layers == (1, 2, 4)  # default_aux_layers(5)
    engine.set_drafter(drafter)
    assert engine.model.feature_layers == (1, 2, 4)
    ids = [3, 17, 42, 8, 60, 9]
    from verl_tlt.modeling.model import sequence_hidden_states

    ours = sequence_hidden_states(engine.model, ids)
    with torch.no_grad():
        theirs = hf_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    hidden = engine.model.spec.hidden_size
    assert ours.shape == (len(ids), 4 * hidden)
    expected = torch.cat([theirs[-1][0]] + [theirs[i][0] for i in (1, 2, 4)], dim=-1)
    assert torch.allclose(ours, expected, atol=1e-4)
    engine.set_drafter(None)
    assert engine.model.feature_layers == ()


def test_tree_and_chain_drafting_compute_the_models_forward(deep_target):
    path, _ = deep_target
    engine = RolloutEngine.from_pretrained(str(path))
    drafter = eagle3_drafter(engine)
    model = drafter.model
    generator = torch.Generator().manual_seed(0)
    sequence = [3, 17, 42, 8, 60, 9]
    wide = torch.randn(len(sequence) - 1, 4 * model.spec.hidden_size, generator=generator)
    root_logits = drafter.begin([DraftContext(sequence, 0, wide)])
    tokens = sequence[1:]
    features = reference_features(model, tokens, list(wide))
    assert close(root_logits[0], model.logits(features[-1]))
    level1 = drafter.expand(torch.tensor([[1, 2]]), torch.tensor([[0, 0]]), torch.tensor([[11, 12]]))
    for token, logits in ((11, level1[0, 0]), (12, level1[0, 1])):
        path_features = reference_features(model, tokens + [token], [*wide, features[-1]])
        assert close(logits, model.logits(path_features[-1]))
    drafter.reset()
    drafter.begin([DraftContext(sequence, 0, wide)])
    chain = drafter.extend_chain(1, torch.tensor([11]))
    assert close(chain[0], level1[0, 0])


@pytest.mark.parametrize("strategy", ["4_1_4", "3_3_8", "5_2_10"])
def test_greedy_sd_with_an_eagle3_drafter_is_token_identical_to_plain(deep_target, strategy):
    path, _ = deep_target
    plain = RolloutEngine.from_pretrained(str(path), max_num_seqs=3).generate(PROMPTS, GREEDY)
    seen = sorted({token for output in plain for token in output.token_ids})
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=3)
    engine.set_drafter(eagle3_drafter(engine, ids=seen[::2]))  # the map misses half of what the target says
    outputs = engine.generate(PROMPTS, GREEDY, strategy=strategy)
    for sd, ref in zip(outputs, plain, strict=True):
        assert sd.token_ids == ref.token_ids
        assert torch.allclose(torch.tensor(sd.log_probs), torch.tensor(ref.log_probs), atol=1e-5)
    assert sum(o.stats["num_verify_steps"] for o in outputs) > 0
    assert sum(o.stats.get("num_accepted_tokens", 0) for o in outputs) > 0


def test_keyed_sampled_sd_with_an_eagle3_drafter_is_token_identical_to_plain(deep_target):
    path, _ = deep_target
    params = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True, seed=5)
    plain = RolloutEngine.from_pretrained(str(path), max_num_seqs=3, sampling="keyed").generate(PROMPTS, params)
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=3, sampling="keyed")
    engine.set_drafter(eagle3_drafter(engine))
    outputs = engine.generate(PROMPTS, params, strategy="3_3_8")
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]


def eagle3_distribution_pvalue(tmp_path, strategy: str, sampling: str) -> float:
    """Chi-square p-value of the first two tokens of 3000 SD samples against the exact target, with an EAGLE-3
    drafter whose map lacks two of the six tokens (among them the target's likeliest first token)."""
    vocab, prompt = 6, [1, 4, 2]
    hf_model = build_tiny_model("qwen3", tmp_path, seed=1, vocab_size=vocab, weight_std=0.3, num_layers=4)
    with torch.no_grad():
        likeliest = int(hf_model(torch.tensor([prompt])).logits[0, -1].argmax())
    engine = RolloutEngine.from_pretrained(str(tmp_path), max_num_seqs=1000, sampling=sampling)
    engine.set_drafter(eagle3_drafter(engine, ids=[t for t in range(vocab) if t != likeliest][:4]))
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=2, ignore_eos=True)
    outputs = engine.generate([prompt] * 3000, params, strategy=strategy)
    assert sum(o.stats["num_verify_steps"] for o in outputs) > 0
    samples = torch.tensor([o.token_ids for o in outputs])
    return chi_square_pvalue(samples, two_token_target_probs(hf_model, prompt, vocab), vocab)


@pytest.mark.parametrize("sampling", SAMPLING_MODES)
@pytest.mark.parametrize("strategy", ["3_1_3", "3_2_5"])
def test_sampled_sd_with_an_eagle3_drafter_keeps_the_targets_distribution(tmp_path, strategy, sampling):
    assert eagle3_distribution_pvalue(tmp_path, strategy, sampling) > 1e-3  # 0.1% false alarms per seed


def test_the_eagle3_distribution_test_catches_a_verifier_that_ignores_the_residual(tmp_path, monkeypatch):
    monkeypatch.setattr(verify_module, "_reject", lambda residual, token, draft_probs: residual)
    assert eagle3_distribution_pvalue(tmp_path, "3_1_3", "rejection") < 1e-6
