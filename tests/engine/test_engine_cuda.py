"""The engine's CUDA paths (gpu marker: skipped without a CUDA device). CI has none; run on a lent GPU machine."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import varied_qwen2  # noqa: F401
from verl_tlt.config import SpeculativeConfig
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.drafts.eagle import EagleDrafter
from verl_tlt.policy import AdaptivePolicy

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
    cuda_engine.policy = AdaptivePolicy(SpeculativeConfig())
    assert [o.token_ids for o in cuda_engine.generate(PROMPTS * 4, greedy)] == plain * 4


def test_sampled_speculation_on_cuda_returns_full_answers_with_log_probs(cuda_engine):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=24, ignore_eos=True, seed=0)
    for strategy in (None, "4_1_4", "8_4_16"):
        outputs = cuda_engine.generate(PROMPTS, params, strategy=strategy)
        assert all(len(o.token_ids) == 24 and len(o.log_probs) == 24 for o in outputs), strategy
        assert all(lp <= 0.0 for o in outputs for lp in o.log_probs), strategy


def graph_engine_pair(path, **kwargs):
    """Two CUDA engines with equal EAGLE drafters, the second replaying decode/verify steps from CUDA graphs."""
    engines = []
    for cuda_graphs in (False, True):
        engine = RolloutEngine.from_pretrained(str(path), device="cuda", cuda_graphs=cuda_graphs, **kwargs)
        torch.manual_seed(0)
        engine.set_drafter(EagleDrafter(EagleDrafterModel.from_target(engine.model)))
        engines.append(engine)
    return engines


# Different max_tokens per prompt: rows leave one by one, so padded batch buckets are exercised.
GRAPH_PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16]]
GRAPH_GREEDY = [SamplingParams(temperature=0, max_tokens=8 + 4 * i, ignore_eos=True) for i in range(5)]


def test_cuda_graphs_decode_like_the_engine_without_them(varied_qwen2):  # noqa: F811
    plain, graphed = graph_engine_pair(varied_qwen2[0], max_num_seqs=5)
    reference = [o.token_ids for o in plain.generate(GRAPH_PROMPTS, GRAPH_GREEDY)]
    for strategy in (None, "4_1_4", "8_4_16"):
        outputs = graphed.generate(GRAPH_PROMPTS, GRAPH_GREEDY, strategy=strategy)
        assert [o.token_ids for o in outputs] == reference, strategy
        expected = plain.generate(GRAPH_PROMPTS, GRAPH_GREEDY, strategy=strategy)
        for got, want in zip(outputs, expected, strict=True):
            assert torch.allclose(torch.tensor(got.log_probs), torch.tensor(want.log_probs), atol=1e-4), strategy
    report = graphed.runner.graphs.memory_report()
    assert report["graphs"] >= 3 and report["captures"] == report["graphs"] and report["padded_rows"] > 0
    assert report["replays"] > report["graphs"]


def test_cuda_graphs_see_new_weights_and_survive_a_released_cache(varied_qwen2):  # noqa: F811
    plain, graphed = graph_engine_pair(varied_qwen2[0], max_num_seqs=5)
    graphed.generate(GRAPH_PROMPTS, GRAPH_GREEDY)
    generator = torch.Generator().manual_seed(0)
    updated = {
        name: tensor.cpu() + 0.3 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in plain.model.hf_weight_views().items()
    }
    for engine in (plain, graphed):
        engine.load_weights(updated.items())  # in place: the graphs read the same memory
    reference = [o.token_ids for o in plain.generate(GRAPH_PROMPTS, GRAPH_GREEDY)]
    assert [o.token_ids for o in graphed.generate(GRAPH_PROMPTS, GRAPH_GREEDY)] == reference
    graphed.release_cache()  # a sleeping rollout: the graphs go with the cache and are captured again
    assert graphed.runner.graphs.memory_report()["graphs"] == 0
    assert [o.token_ids for o in graphed.generate(GRAPH_PROMPTS, GRAPH_GREEDY, strategy="4_1_4")] == reference
    sampled = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, ignore_eos=True, seed=0)
    outputs = graphed.generate(GRAPH_PROMPTS, sampled, strategy="4_1_4")
    assert all(len(o.token_ids) == 16 and all(lp <= 0.0 for lp in o.log_probs) for o in outputs)
