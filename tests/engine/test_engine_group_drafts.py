"""Group (suffix and mixed) drafts in the torch engine: exactly plain decoding's tokens and distribution."""

from __future__ import annotations

import pytest
import torch

from tests.engine.drafters import HFModelDrafter
from tests.engine.test_engine_speculative import GREEDY, PROMPTS, drafters, make_engine, two_token_target_probs
from tests.spec.sd_harness import chi_square_pvalue
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine import speculative_step as step_module
from verl_tlt.engine.config import SAMPLING_MODES
from verl_tlt.engine.drafts.group import GroupDrafts
from verl_tlt.spec import verify as verify_module

GROUP_STRATEGIES = ["suffix:6_1_6", "suffix:4_3_8", "mixed:4_1_4"]
SIBLINGS = 3
# Each prompt answered SIBLINGS times; max_num_seqs=3 in make_engine, so siblings join and leave mid-run.
GROUPED_PROMPTS = [prompt for prompt in PROMPTS for _ in range(SIBLINGS)]
GROUPS = [number for number in range(len(PROMPTS)) for _ in range(SIBLINGS)]


def group_engine(varied_qwen2, drafter_name: str = "noisy", **kwargs) -> RolloutEngine:
    drafter = drafters(varied_qwen2[1])[drafter_name]
    return make_engine(varied_qwen2, drafter, group_drafts=GroupDrafts(min_match=2), **kwargs)


@pytest.mark.parametrize("strategy", GROUP_STRATEGIES)
@pytest.mark.parametrize("drafter_name", ["perfect", "adversarial"])
def test_greedy_group_drafts_are_token_identical_to_plain(varied_qwen2, strategy, drafter_name):
    plain = make_engine(varied_qwen2).generate(GROUPED_PROMPTS, GREEDY)
    engine = group_engine(varied_qwen2, drafter_name)
    outputs = engine.generate(GROUPED_PROMPTS, GREEDY, strategy=strategy, groups=GROUPS)
    for sd, ref in zip(outputs, plain, strict=True):
        assert sd.token_ids == ref.token_ids
        assert torch.allclose(torch.tensor(sd.log_probs), torch.tensor(ref.log_probs), atol=1e-5)
    # Greedy siblings answer alike: the later ones are drafted from the first, and the drafts are taken.
    assert engine.stats.accepted_by_source["suffix"] > 0
    assert engine.stats.drafted_by_source["suffix"] >= engine.stats.accepted_by_source["suffix"]
    if strategy.startswith("mixed"):
        assert engine.stats.drafted_by_source["eagle"] > 0


@pytest.mark.parametrize("strategy", GROUP_STRATEGIES)
def test_keyed_sampled_group_drafts_are_token_identical_to_plain(varied_qwen2, strategy):
    params = SamplingParams(temperature=0.7, top_k=30, max_tokens=24, ignore_eos=True)
    plain = make_engine(varied_qwen2, seed=5).generate(GROUPED_PROMPTS, params)
    engine = group_engine(varied_qwen2, seed=5)
    outputs = engine.generate(GROUPED_PROMPTS, params, strategy=strategy, groups=GROUPS)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]
    assert sum(o.stats["num_verify_steps"] for o in outputs) > 0


def test_the_prompts_history_drafts_for_its_next_rollout(varied_qwen2):
    engine = group_engine(varied_qwen2)
    first = engine.generate(PROMPTS, GREEDY, strategy="suffix:6_1_6", groups=range(len(PROMPTS)))
    accepted_first = engine.stats.accepted_by_source["suffix"]
    second = engine.generate(PROMPTS, GREEDY, strategy="suffix:6_1_6", groups=[f"again{i}" for i in range(5)])
    assert [o.token_ids for o in second] == [o.token_ids for o in first]
    # Alone in its group, a request drafts from its own text only the first time; the second time its earlier answer
    # is there, and greedy decoding repeats it.
    assert engine.stats.accepted_by_source["suffix"] - accepted_first > 2 * accepted_first
    assert sum(o.stats["num_accepted_tokens"] for o in second) > 0.8 * sum(len(o.token_ids) for o in second) - 5 * 8


def test_a_suffix_step_without_any_match_decodes_plainly(varied_qwen2):
    engine = group_engine(varied_qwen2)
    outputs = engine.generate([[5]], SamplingParams(temperature=0, max_tokens=1), strategy="suffix:4_1_4")
    assert len(outputs[0].token_ids) == 1 and outputs[0].stats["num_verify_steps"] == 0


def test_failing_group_drafts_turn_group_drafts_off_but_not_the_drafter(varied_qwen2, monkeypatch):
    engine = group_engine(varied_qwen2)

    def broken(requests, strategy):
        raise KeyError("index")

    monkeypatch.setattr(engine.group_drafts, "_propose", broken)
    outputs = engine.generate(PROMPTS, GREEDY, strategy="mixed:4_1_4", groups=range(len(PROMPTS)))
    assert all(len(o.token_ids) == GREEDY.max_tokens for o in outputs)
    assert engine.speculation.group_drafts_error and "KeyError" in engine.speculation.group_drafts_error
    assert engine.drafter_error is None
    after = engine.generate(PROMPTS[:1], GREEDY, strategy="4_1_4")
    assert after[0].stats["num_verify_steps"] > 0  # the drafter still speculates


def test_a_suffix_strategy_needs_no_drafter(varied_qwen2):
    engine = make_engine(varied_qwen2)  # no drafter: group drafts are made on first use
    outputs = engine.generate(GROUPED_PROMPTS, GREEDY, strategy="suffix:4_1_4", groups=GROUPS)
    assert engine.group_drafts is not None and sum(o.stats["num_verify_steps"] for o in outputs) > 0
    with pytest.raises(ValueError, match="needs a drafter"):
        engine.generate(PROMPTS, GREEDY, strategy="mixed:4_1_4")
    with pytest.raises(ValueError, match="groups"):
        engine.generate(PROMPTS, GREEDY, strategy="suffix:4_1_4", groups=[1])


# A prompt that repeats itself, so that every request has suffix drafts from its first token on (its own text), and
# a short continuation after the match, so that mixed chains also need the drafter.
REPEATING_PROMPT = [3, 1, 4, 1, 4, 1, 4]


def group_distribution_pvalue(tmp_path, strategy: str, sampling: str) -> float:
    """Chi-square p-value of the first two tokens of 3000 group-drafted samples against the exact processed target."""
    from tests.engine.conftest import build_tiny_model

    vocab, num_requests, num_tokens, prompt = 6, 3000, 2, REPEATING_PROMPT
    hf_model = build_tiny_model("qwen2", tmp_path, seed=1, vocab_size=vocab, weight_std=0.3)
    draft_model = build_tiny_model("qwen2", tmp_path / "draft", seed=2, vocab_size=vocab, weight_std=0.3)
    engine = RolloutEngine.from_pretrained(
        str(tmp_path),
        drafter=HFModelDrafter(draft_model),
        max_num_seqs=1000,
        sampling=sampling,
        group_drafts=GroupDrafts(min_match=2),
    )
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=num_tokens, ignore_eos=True)
    groups = [number // 8 for number in range(num_requests)]  # groups of 8 siblings
    outputs = engine.generate([prompt] * num_requests, params, strategy=strategy, groups=groups)
    assert engine.stats.drafted_by_source["suffix"] > num_requests // 2  # most requests verified group drafts
    samples = torch.tensor([o.token_ids for o in outputs])
    return chi_square_pvalue(samples, two_token_target_probs(hf_model, prompt, vocab), vocab)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", SAMPLING_MODES)
@pytest.mark.parametrize("strategy", ["suffix:3_1_3", "suffix:3_2_5", "mixed:3_1_3"])
def test_sampled_group_drafts_match_the_target_distribution(tmp_path, strategy, sampling):
    assert group_distribution_pvalue(tmp_path, strategy, sampling) > 1e-3  # false-alarm rate 0.1% per (fixed) seed


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["suffix:3_1_3", "suffix:3_2_5", "mixed:3_1_3"])
def test_group_distribution_test_catches_a_verifier_that_keeps_rejected_drafts(tmp_path, strategy, monkeypatch):
    # A point-mass draft that is rejected must leave the residual; keeping it there over-samples the drafted token.
    monkeypatch.setattr(verify_module, "_reject", lambda residual, token, draft_probs: residual)
    assert group_distribution_pvalue(tmp_path, strategy, "rejection") < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["suffix:3_1_3", "mixed:3_1_3"])
def test_group_distribution_test_catches_keyed_verification_that_forgets_the_noise(tmp_path, strategy, monkeypatch):
    real = step_module.verify_keyed
    monkeypatch.setattr(step_module, "verify_keyed", lambda tree, logits, noise: real(tree, logits, 0 * noise))
    assert group_distribution_pvalue(tmp_path, strategy, "keyed") < 1e-6
