"""Speculative decoding on the real SmolLM2-135M-Instruct: greedy token identity with plain decoding.

Slow (main tier): the model comes from the test cache (`tests/models/test_smollm2.py` prepares it; the first run
pays the conversion). Greedy identity is checked with an EAGLE drafter built from the target and left untrained
(losslessness must hold for any drafter; a poor one is rejected on nearly every step) and with the target itself
as drafter (nearly always accepted). The sampled distribution on the real weights is
`test_smollm2_sd_distribution.py`'s.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.drafters import HFModelDrafter
from verl_tlt.chat import chat_prompt_ids
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.drafts.eagle import EagleDrafter

pytestmark = pytest.mark.slow

QUESTIONS = ["What is 17 + 25? Think step by step.", "Write one sentence about the sea."]


@pytest.fixture(scope="module")
def smollm2(smollm2_model):
    path, tokenizer, model = smollm2_model
    prompts = [chat_prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    return path, model, prompts


def engine_with(path, drafter_kind: str, hf_model, **kwargs) -> RolloutEngine:
    engine = RolloutEngine.from_pretrained(str(path), max_model_len=256, **kwargs)
    if drafter_kind == "eagle":
        torch.manual_seed(0)
        engine.set_drafter(EagleDrafter(EagleDrafterModel.from_target(engine.model), max_len=engine.cache.max_len))
    else:  # the target proposing to itself
        engine.set_drafter(HFModelDrafter(hf_model))
    return engine


@pytest.mark.parametrize("strategy", ["4_1_4", "3_3_8"])
@pytest.mark.parametrize("drafter_kind", ["eagle", "target"])
def test_greedy_sd_on_smollm2_is_token_identical_to_plain(smollm2, strategy, drafter_kind):
    path, hf_model, prompts = smollm2
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
