"""The engine's CUDA paths (gpu marker: skipped without a CUDA device). CI has none; run on a lent GPU machine."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import varied_qwen2  # noqa: F401
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.adaptive import AdaptivePolicy
from verl_tlt.engine.eagle_drafter import EagleDrafter

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


@pytest.fixture()
def cuda_engine(varied_qwen2):  # noqa: F811
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]), device="cuda")
    torch.manual_seed(0)
    engine.set_drafter(EagleDrafter(EagleDrafterModel.from_target(engine.model)))
    return engine


def test_greedy_speculation_on_cuda_reproduces_plain_decoding(cuda_engine):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = [o.token_ids for o in cuda_engine.generate(PROMPTS, greedy)]
    for strategy in ("4_1_4", "8_4_16"):
        assert [o.token_ids for o in cuda_engine.generate(PROMPTS, greedy, strategy=strategy)] == plain, strategy
    cuda_engine.policy = AdaptivePolicy()
    assert [o.token_ids for o in cuda_engine.generate(PROMPTS * 4, greedy)] == plain * 4


def test_sampled_speculation_on_cuda_returns_full_answers_with_log_probs(cuda_engine):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=24, ignore_eos=True, seed=0)
    for strategy in (None, "4_1_4", "8_4_16"):
        outputs = cuda_engine.generate(PROMPTS, params, strategy=strategy)
        assert all(len(o.token_ids) == 24 and len(o.log_probs) == 24 for o in outputs), strategy
        assert all(lp <= 0.0 for o in outputs for lp in o.log_probs), strategy
