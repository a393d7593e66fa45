"""Sampled speculative decoding on the real SmolLM2-135M-Instruct keeps the target's distribution.

Slow (main tier). A drafter is warmed up on the model's own answers (a small `warmup_drafter` run: a few prompts, a
few dozen steps, its draft vocabulary chosen from those answers), then 1000 requests sample two tokens at T=1,
top-k 3 through a 2-token chain; the (first, second) token pairs are tested against the model's exact pair
probabilities (chi-square over the 9 cells), under rejection and keyed sampling. The first token comes from the
prefill, so the chain's draft decides the second. The drafter's draft vocabulary is cut to the target's second and
third likeliest tokens after its likeliest first token (a third of the requests at least): there the warmed
drafter's logits split the draft between two tokens the target samples too, while the target's likeliest next token
is never drafted, so the draft distribution differs from the target's whatever the short warm-up learned. The
negative control, a verifier that resamples from the target instead of the residual after a rejection, must fail
the same test. (A map that kept the warmed drafter's vocabulary, then one of the likeliest first tokens, left the
control without power on clean clones, p = 0.94: every draft fell outside the target's top 3 and was rejected, and
the residual of a draft the target never samples is the target's own distribution.)
"""

from __future__ import annotations

import pytest
import torch

from tests.spec.sd_harness import chi_square_pvalue
from verl_tlt.config import DrafterConfig
from verl_tlt.drafter.draft_vocab import DraftVocab
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.spec import LogitsParams
from verl_tlt.spec import verify as verify_module

pytestmark = pytest.mark.slow

TOP_K = 3
NUM_REQUESTS = 1000
WARMUP_QUESTIONS = ["What is 17 + 25?", "Write one sentence about the sea.", "Name three colours.", "What is 9 x 8?"]


@pytest.fixture(scope="module")
def warmed(smollm2_model, tmp_path_factory):
    """(model folder, hf model, a warmed-up drafter folder, a short raw prompt)."""
    from verl_tlt.chat import chat_prompt_ids
    from verl_tlt.warmup.offline import warmup_drafter

    path, tokenizer, hf_model = smollm2_model
    prompts = [chat_prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in WARMUP_QUESTIONS]
    out = tmp_path_factory.mktemp("smollm2_drafter") / "drafter"
    config = DrafterConfig(lr=1e-3, grad_clip_norm=5.0, max_tokens_per_batch=512)
    cache = tmp_path_factory.mktemp("warmup_cache")
    warmup_drafter(
        str(path), prompts, out, num_steps=30, temperature=1.0, max_tokens=64, config=config, cache_root=cache
    )
    prompt = tokenizer("The capital of France is")["input_ids"]
    return path, hf_model, out, prompt


def pair_probs(hf_model, prompt: list[int]) -> tuple[torch.Tensor, list[int], list[list[int]]]:
    """[16] probabilities of (rank of the first token among its top-3, rank of the second among its top-3) on a
    4 x 4 grid (rank 3 = outside the top-k: probability 0), with the top-3 ids of each position."""
    process = LogitsParams.from_lists([1.0], [TOP_K], [1.0]).process
    with torch.no_grad():
        first = process(hf_model(torch.tensor([prompt])).logits[:, -1]).softmax(-1)[0]
        first_probs, first_ids = first.topk(TOP_K)
        second_logits = hf_model(torch.tensor([prompt + [int(t)] for t in first_ids])).logits[:, -1]
    processed = LogitsParams.from_lists([1.0] * TOP_K, [TOP_K] * TOP_K, [1.0] * TOP_K).process(second_logits)
    second_probs, second_ids = processed.softmax(-1).topk(TOP_K)
    grid = torch.zeros(TOP_K + 1, TOP_K + 1, dtype=torch.float64)
    grid[:TOP_K, :TOP_K] = first_probs.double().unsqueeze(1) * second_probs.double()
    return grid.flatten(), first_ids.tolist(), second_ids.tolist()


def sd_pvalue(warmed, sampling: str) -> float:
    path, hf_model, drafter, prompt = warmed
    expected, first_ids, second_ids = pair_probs(hf_model, prompt)
    engine = RolloutEngine.from_pretrained(
        str(path), drafter=str(drafter), max_num_seqs=1000, max_model_len=64, sampling=sampling
    )
    model = engine.drafter.model
    # The first token comes from the prefill; the chain drafts the second. After the likeliest first token the draft
    # can be only the target's second and third likeliest next tokens (see the module docstring).
    kept = [second_ids[0][1], second_ids[0][2]]
    model.set_draft_vocab(DraftVocab(torch.tensor(kept), model.spec.vocab_size, len(kept)))
    params = SamplingParams(temperature=1.0, top_k=TOP_K, max_tokens=2, ignore_eos=True)
    outputs = engine.generate([prompt] * NUM_REQUESTS, params, strategy="2_1_2")
    assert sum(o.stats["num_verify_steps"] for o in outputs) > 0
    ranks = []
    for output in outputs:
        first, second = output.token_ids
        rank1 = first_ids.index(first) if first in first_ids else TOP_K
        rank2 = second_ids[rank1].index(second) if rank1 < TOP_K and second in second_ids[rank1] else TOP_K
        ranks.append([rank1, rank2])
    return chi_square_pvalue(torch.tensor(ranks), expected, TOP_K + 1)


@pytest.mark.parametrize("sampling", ["rejection", "keyed"])
def test_sampled_sd_with_a_warmed_drafter_keeps_smollm2s_distribution(warmed, sampling):
    assert sd_pvalue(warmed, sampling) > 1e-3  # false alarms 0.1% per (fixed) seed


def test_the_test_catches_a_verifier_that_ignores_the_residual(warmed, monkeypatch):
    monkeypatch.setattr(verify_module, "_reject", lambda residual, token, draft_probs: residual)
    assert sd_pvalue(warmed, "rejection") < 1e-6
