"""Speculative decoding on the real SmolLM2-135M-Instruct: greedy token identity, and the sampled distribution.

Slow (main tier): the model comes from the test cache (`tests/models/test_smollm2.py` prepares it; the first run
pays the conversion). The drafter is an EAGLE drafter built from the target and left untrained: losslessness must
hold for any drafter, and a poor one exercises rejection on every step; the target itself as drafter (always
accepted) covers the other end.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.engine.drafters import HFModelDrafter
from verl_tlt.chat import chat_prompt_ids
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.eagle_drafter import EagleDrafter
from verl_tlt.models.prepare import ensure_model
from verl_tlt.spec import LogitsParams
from verl_tlt.spec import verify as verify_module

pytestmark = pytest.mark.slow

QUESTIONS = ["What is 17 + 25? Think step by step.", "Write one sentence about the sea."]
TOP_K = 3  # the distribution test's support: 3 x 3 pairs of first two tokens, each with a real probability
# A plain-text prompt of a few tokens whose continuation is uncertain: 1200 copies prefill in seconds (a chat prompt
# is about 40 tokens, ten times the work), and an open continuation gives the test its power.
OPEN_PROMPT = "My favourite colour is"


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ensure_model("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [chat_prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, model, prompts, list(tokenizer(OPEN_PROMPT)["input_ids"])


def engine_with(path, drafter_kind: str, hf_model, **kwargs) -> RolloutEngine:
    engine = RolloutEngine.from_pretrained(str(path), max_model_len=256, **kwargs)
    if drafter_kind == "eagle":
        torch.manual_seed(0)
        engine.set_drafter(EagleDrafter(EagleDrafterModel.from_target(engine.model), max_len=engine.cache.max_len))
    else:
        engine.set_drafter(HFModelDrafter(hf_model))
    return engine


@pytest.mark.parametrize("strategy", ["4_1_4", "3_3_8"])
@pytest.mark.parametrize("drafter_kind", ["eagle", "target"])
def test_greedy_sd_on_smollm2_is_token_identical_to_plain(smollm2, strategy, drafter_kind):
    path, hf_model, prompts, _ = smollm2
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engine = engine_with(path, drafter_kind, hf_model, max_num_seqs=len(prompts))
    plain = engine.generate(prompts, params)
    speculative = engine.generate(prompts, params, strategy=strategy)
    for sd, ref in zip(speculative, plain, strict=True):
        assert sd.token_ids == ref.token_ids
        assert torch.allclose(torch.tensor(sd.log_probs), torch.tensor(ref.log_probs), atol=1e-4)
    accepted = sum(o.stats["num_accepted_tokens"] for o in speculative)
    if drafter_kind == "target":  # the target proposing to itself: nearly every draft token is taken
        assert accepted >= 0.7 * sum(len(o.token_ids) for o in speculative)


def pair_distribution(hf_model, prompt: list[int]) -> dict[tuple[int, int], float]:
    """Exact probability of each (first, second) token pair after `prompt` at T=1, top-k TOP_K."""
    params = lambda n: LogitsParams.from_lists([1.0] * n, [TOP_K] * n, [1.0] * n)  # noqa: E731
    with torch.no_grad():
        first = params(1).process(hf_model(torch.tensor([prompt])).logits[:, -1]).softmax(-1)[0].double()
        firsts = [int(t) for t in torch.nonzero(first).flatten()]
        second_logits = hf_model(torch.tensor([prompt + [t] for t in firsts])).logits[:, -1]
        second = params(len(firsts)).process(second_logits).softmax(-1).double()
    return {
        (a, int(b)): float(first[a] * second[row, b])
        for row, a in enumerate(firsts)
        for b in torch.nonzero(second[row]).flatten()
    }


def sd_pair_pvalue(smollm2, sampling: str, samples: int = 1200) -> float:
    """Chi-square p-value of the first two tokens of `samples` SD continuations against the exact target pairs."""
    path, hf_model, _, prompt = smollm2
    engine = engine_with(path, "eagle", hf_model, max_num_seqs=300, sampling=sampling)
    params = [
        SamplingParams(temperature=1.0, top_k=TOP_K, max_tokens=2, ignore_eos=True, seed=i) for i in range(samples)
    ]
    outputs = engine.generate([prompt] * samples, params, strategy="3_2_5")
    assert sum(o.stats["num_verify_steps"] for o in outputs) > 0
    expected = pair_distribution(hf_model, prompt)
    observed = Counter(tuple(o.token_ids) for o in outputs)
    if set(observed) - set(expected):
        return 0.0  # a pair the target gives probability zero
    cells = [(observed[pair], p * samples) for pair, p in expected.items()]
    big, small = [c for c in cells if c[1] >= 5], [c for c in cells if c[1] < 5]
    if small:  # rare pairs pooled, so every cell expects >= 5 (as tests/spec/sd_harness.chi_square_pvalue does)
        big.append((sum(o for o, _ in small), sum(e for _, e in small)))
    statistic = sum((o - e) ** 2 / e for o, e in big)
    dof = torch.tensor((len(big) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, torch.tensor(statistic / 2, dtype=torch.float64)))


@pytest.mark.parametrize("sampling", ["keyed", "rejection"])
def test_sampled_sd_on_smollm2_has_the_targets_distribution(smollm2, sampling):
    assert sd_pair_pvalue(smollm2, sampling) > 1e-3  # false-alarm rate 0.1% per (fixed) seed set


def test_the_smollm2_distribution_test_catches_a_verifier_that_ignores_the_residual(smollm2, monkeypatch):
    monkeypatch.setattr(verify_module, "_reject", lambda residual, token, draft_probs: residual)
    assert sd_pair_pvalue(smollm2, "rejection") < 1e-6
