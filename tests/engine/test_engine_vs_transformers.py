"""The torch engine must reproduce transformers exactly: greedy tokens identical, log-probs within 1e-4."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import ARCHS, EOS, build_tiny_model
from verl_tlt.engine import RolloutEngine, SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [23]]


def hf_log_probs(model, prompt: list[int], response: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_tokens_match_transformers_generate(arch, tmp_path):
    model = build_tiny_model(arch, tmp_path)
    engine = RolloutEngine.from_pretrained(str(tmp_path))
    outputs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        expected = model.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :].tolist()
        assert output.token_ids == expected
        assert output.finish_reason == "length"
        lp = hf_log_probs(model, prompt, output.token_ids)
        assert torch.allclose(torch.tensor(output.log_probs), lp, atol=1e-4)


def test_sampled_log_probs_match_tempered_transformers_distribution(tiny_qwen2):
    path, model = tiny_qwen2
    engine = RolloutEngine.from_pretrained(str(path))
    params = SamplingParams(temperature=0.7, max_tokens=16, ignore_eos=True, seed=3)
    for prompt, output in zip(PROMPTS, engine.generate(PROMPTS, params), strict=True):
        lp = hf_log_probs(model, prompt, output.token_ids, temperature=0.7)
        assert torch.allclose(torch.tensor(output.log_probs), lp, atol=1e-4)


def test_raw_logprobs_mode_ignores_temperature(tiny_qwen2):
    path, model = tiny_qwen2
    engine = RolloutEngine.from_pretrained(str(path), logprobs_mode="raw_logprobs")
    (output,) = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.5, max_tokens=8, ignore_eos=True, seed=1))
    lp = hf_log_probs(model, PROMPTS[0], output.token_ids, temperature=1.0)
    assert torch.allclose(torch.tensor(output.log_probs), lp, atol=1e-4)


def test_bf16_engine_runs_and_greedy_mostly_agrees(tiny_qwen2):
    path, _ = tiny_qwen2
    fp32 = RolloutEngine.from_pretrained(str(path)).generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8))
    bf16 = RolloutEngine.from_pretrained(str(path), dtype=torch.bfloat16).generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=8)
    )
    assert all(len(o.token_ids) >= 1 for o in bf16)
    first_tokens_agree = sum(a.token_ids[0] == b.token_ids[0] for a, b in zip(fp32, bf16, strict=True))
    assert first_tokens_agree >= len(PROMPTS) - 1
    assert EOS not in [t for o in bf16 for t in o.token_ids[:-1]]  # EOS only ever ends an output


def test_long_generation_across_kv_cache_growth_matches_transformers(tiny_qwen2):
    # The cache starts small and doubles; 150 tokens cross two reallocations (and slot growth with 5 requests).
    path, model = tiny_qwen2
    engine = RolloutEngine.from_pretrained(str(path))
    prompts = [*PROMPTS, [40, 41, 42]]
    outputs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=150, ignore_eos=True))
    for prompt, output in zip(prompts[:2], outputs[:2], strict=True):
        expected = model.generate(
            torch.tensor([prompt]), max_new_tokens=150, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :].tolist()
        assert output.token_ids == expected
    assert engine.cache.capacity_len >= 150 and engine.cache.num_slots >= 5
