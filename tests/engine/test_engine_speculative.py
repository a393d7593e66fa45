"""Speculative decoding in the torch engine: exact greedy output, target log-probs, stats, switching, errors."""

from __future__ import annotations

import pytest
import torch

from tests.engine.drafters import HFModelDrafter, SyncCountingDrafter
from tests.spec.sd_harness import chi_square_pvalue
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine import speculative_step as step_module
from verl_tlt.engine.config import SAMPLING_MODES
from verl_tlt.spec import LogitsParams, SpecStrategy
from verl_tlt.spec import verify as verify_module

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20], [21], [30, 31, 32]]
STRATEGIES = {"chain": SpecStrategy(4), "tree": SpecStrategy(3, 3, 8), "deep-tree": SpecStrategy(5, 2, 10)}
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def make_engine(varied_qwen2, drafter=None, **kwargs) -> RolloutEngine:
    kwargs.setdefault("max_num_seqs", 3)
    return RolloutEngine.from_pretrained(str(varied_qwen2[0]), drafter=drafter, **kwargs)


def drafters(hf_model):
    return {
        "perfect": HFModelDrafter(hf_model),
        "noisy": HFModelDrafter(hf_model, noise=1.0),
        "adversarial": HFModelDrafter(hf_model, sign=-1.0),
    }


@pytest.mark.parametrize("strategy", STRATEGIES.values(), ids=STRATEGIES.keys())
@pytest.mark.parametrize("drafter_name", ["perfect", "noisy", "adversarial"])
def test_greedy_sd_is_token_identical_to_plain(varied_qwen2, strategy, drafter_name):
    plain = make_engine(varied_qwen2).generate(PROMPTS, GREEDY)
    engine = make_engine(varied_qwen2, drafters(varied_qwen2[1])[drafter_name])
    outputs = engine.generate(PROMPTS, GREEDY, strategy=strategy)  # max_num_seqs=3: rows join and leave mid-run
    for sd, ref in zip(outputs, plain, strict=True):
        assert sd.token_ids == ref.token_ids
        assert torch.allclose(torch.tensor(sd.log_probs), torch.tensor(ref.log_probs), atol=1e-5)
        assert sd.stats["num_verify_steps"] > 0


def first_new_token_after(reference_tokens: list[int], index: int) -> tuple[int, int]:
    """A token of the reference output at or after `index` that does not occur before it, and its position."""
    for position in range(index, len(reference_tokens)):
        if reference_tokens[position] not in reference_tokens[:position]:
            return reference_tokens[position], position
    raise AssertionError(f"reference output repeats itself: {reference_tokens}")


@pytest.mark.parametrize("strategy", STRATEGIES.values(), ids=STRATEGIES.keys())
def test_eos_stop_and_max_tokens_inside_a_draft_end_the_output_there(varied_qwen2, strategy):
    prompt = PROMPTS[0]
    reference = make_engine(varied_qwen2).generate([prompt], GREEDY)[0].token_ids
    # With a perfect drafter, steps emit depth + 1 tokens: position 6 lies inside the second draft.
    stop_token, first = first_new_token_after(reference, 6)
    cases = [
        (SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[stop_token], ignore_eos=True), "stop"),
        (SamplingParams(temperature=0, max_tokens=7, ignore_eos=True), "length"),
    ]
    for params, reason in cases:
        plain = make_engine(varied_qwen2).generate([prompt], params)[0]
        sd = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1])).generate([prompt], params, strategy=strategy)[0]
        assert sd.token_ids == plain.token_ids and sd.finish_reason == plain.finish_reason == reason
        assert sd.log_probs == pytest.approx(plain.log_probs, abs=1e-5)
    # EOS: make the reference's token the engine's EOS.
    with_eos = SamplingParams(temperature=0, max_tokens=24)
    plain = make_engine(varied_qwen2, eos_token_ids=[stop_token]).generate([prompt], with_eos)[0]
    engine = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1]), eos_token_ids=[stop_token])
    sd = engine.generate([prompt], with_eos, strategy=strategy)[0]
    assert sd.token_ids == plain.token_ids == reference[: first + 1] and sd.finish_reason == "stop"


def test_max_model_len_inside_a_draft(varied_qwen2):
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    plain = make_engine(varied_qwen2, max_model_len=20).generate(PROMPTS, params)
    engine = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1]), max_model_len=20)
    sd = engine.generate(PROMPTS, params, strategy="4_1_4")
    assert [o.token_ids for o in sd] == [o.token_ids for o in plain]
    assert all(len(o.prompt_token_ids) + len(o.token_ids) == 20 and o.finish_reason == "length" for o in sd)


def test_perfect_drafter_is_fully_accepted_and_adversarial_not_at_all(varied_qwen2):
    chain = SpecStrategy(4)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    perfect = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1])).generate(PROMPTS, params, strategy=chain)
    for output in perfect:
        stats = output.stats
        assert stats["num_draft_tokens"] == 4 * stats["num_verify_steps"]
        assert stats["num_accepted_tokens"] == stats["num_draft_tokens"]  # every draft of every step accepted
    adversarial = HFModelDrafter(varied_qwen2[1], sign=-1.0)
    for output in make_engine(varied_qwen2, adversarial).generate(PROMPTS, params, strategy=chain):
        assert output.stats["num_accepted_tokens"] == 0
        assert output.stats["num_verify_steps"] == len(output.token_ids) - 1  # first token comes from prefill


MIXED_SCHEDULE = [None, "3_1_3", "3_2_5", None, None, "2_1_2", "4_3_9"]


def run_schedule(engine: RolloutEngine, schedule: list[str | None]) -> dict:
    """Step the engine to the end with strategies from `schedule` in turn (None = plain); outputs by request id."""
    done, step = {}, 0
    while engine.has_unfinished():
        for output in engine.step(schedule[step % len(schedule)]):
            done[output.request_id] = output
        step += 1
    return done


def test_engine_switches_between_plain_and_sd_at_any_step(varied_qwen2):
    plain = make_engine(varied_qwen2, max_num_seqs=8).generate(PROMPTS, GREEDY)
    engine = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1], noise=0.5, check_hidden=True), max_num_seqs=8)
    for prompt in PROMPTS:
        engine.add_request(prompt, GREEDY, request_id=str(len(engine.scheduler.waiting)))
    done = run_schedule(engine, MIXED_SCHEDULE)
    assert [done[str(i)].token_ids for i in range(len(PROMPTS))] == [o.token_ids for o in plain]
    assert engine.drafter.hidden_checks > 0  # the drafter saw exactly the target's hidden states


def test_sampled_sd_log_probs_are_the_targets(varied_qwen2):
    path, hf_model = varied_qwen2
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_tokens=16, ignore_eos=True, seed=3)
    engine = make_engine(varied_qwen2, HFModelDrafter(hf_model, noise=0.5))
    for strategy in ("4_1_4", "3_3_8"):
        for prompt, output in zip(PROMPTS, engine.generate(PROMPTS, params, strategy=strategy), strict=True):
            sequence = torch.tensor([prompt + output.token_ids])
            with torch.no_grad():
                logits = hf_model(sequence).logits[0, len(prompt) - 1 : -1]  # distributions the tokens came from
            rows = len(output.token_ids)
            lp = LogitsParams.from_lists([0.8] * rows, [20] * rows, [0.9] * rows)
            expected = lp.process(logits).log_softmax(-1).gather(-1, torch.tensor(output.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(output.log_probs), expected, atol=1e-4)


def engine_distribution_pvalue(tmp_path, strategy: str, sampling: str) -> float:
    """Chi-square p-value of the first two tokens of 3000 SD samples against the exact processed target."""
    from tests.engine.conftest import build_tiny_model

    vocab, num_requests, num_tokens, prompt = 6, 3000, 2, [1, 4, 2]
    hf_model = build_tiny_model("qwen2", tmp_path, seed=1, vocab_size=vocab, weight_std=0.3)
    draft_model = build_tiny_model("qwen2", tmp_path / "draft", seed=2, vocab_size=vocab, weight_std=0.3)
    engine = RolloutEngine.from_pretrained(
        str(tmp_path), drafter=HFModelDrafter(draft_model), max_num_seqs=1000, sampling=sampling
    )
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=num_tokens, ignore_eos=True)
    outputs = engine.generate([prompt] * num_requests, params, strategy=strategy)
    assert sum(o.stats["num_verify_steps"] for o in outputs) > 0
    samples = torch.tensor([o.token_ids for o in outputs])
    return chi_square_pvalue(samples, two_token_target_probs(hf_model, prompt, vocab), vocab)


def two_token_target_probs(hf_model, prompt: list[int], vocab: int, top_p: float = 0.95) -> torch.Tensor:
    """[vocab * vocab] exact probability of each pair of first two tokens after `prompt` (T=1, top_p), float64."""
    with torch.no_grad():
        first_logits = hf_model(torch.tensor([prompt])).logits[:, -1]
        second_logits = hf_model(torch.tensor([prompt + [t] for t in range(vocab)])).logits[:, -1]
    first = LogitsParams.from_lists([1.0], [-1], [top_p]).process(first_logits).softmax(-1)[0]
    second = LogitsParams.from_lists([1.0] * vocab, [-1] * vocab, [top_p] * vocab).process(second_logits).softmax(-1)
    return (first.unsqueeze(1) * second).flatten().double()


@pytest.mark.parametrize("sampling", SAMPLING_MODES)
@pytest.mark.parametrize("strategy", ["3_1_3", "3_2_5"])
def test_sampled_sd_matches_target_distribution_in_the_engine(tmp_path, strategy, sampling):
    assert engine_distribution_pvalue(tmp_path, strategy, sampling) > 1e-3  # false-alarm rate 0.1% per (fixed) seed


@pytest.mark.parametrize("strategy", ["3_1_3", "3_2_5"])
def test_engine_distribution_test_catches_a_verifier_that_ignores_the_residual(tmp_path, strategy, monkeypatch):
    monkeypatch.setattr(verify_module, "_reject", lambda residual, token, draft_probs: residual)
    assert engine_distribution_pvalue(tmp_path, strategy, "rejection") < 1e-6


@pytest.mark.parametrize("strategy", ["3_1_3", "3_2_5"])
def test_engine_distribution_test_catches_keyed_verification_that_forgets_the_noise(tmp_path, strategy, monkeypatch):
    # Verifying on the unperturbed target makes every token a speculative step emits the target's argmax.
    real = step_module.verify_keyed
    monkeypatch.setattr(step_module, "verify_keyed", lambda tree, logits, noise: real(tree, logits, 0 * noise))
    assert engine_distribution_pvalue(tmp_path, strategy, "keyed") < 1e-6


def test_drafter_follows_slot_compaction_and_reset(varied_qwen2):
    drafter = SyncCountingDrafter(varied_qwen2[1])
    engine = make_engine(varied_qwen2, drafter)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (2, 9, 3, 12, 5)]
    engine.generate(PROMPTS, params, strategy="2_1_2")
    assert drafter.moves  # rows 0/2 finish first and the last row is moved into their slot
    engine.reset()
    assert drafter.resets == 1


def test_bad_speculative_configurations_fail_with_clear_errors(varied_qwen2):
    with pytest.raises(ValueError, match="needs a drafter"):
        make_engine(varied_qwen2).generate(PROMPTS, GREEDY, strategy="4_1_4")
    engine = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1]), max_draft_tokens=8)
    with pytest.raises(ValueError, match="max_draft_tokens"):
        engine.generate(PROMPTS, GREEDY, strategy="4_4_16")
    with pytest.raises(ValueError, match="depth_topk_treetokens"):
        engine.generate(PROMPTS, GREEDY, strategy="4-1")
    with pytest.raises(ValueError, match="tree_tokens"):
        SpecStrategy(2, 2, 7)  # a depth-2, top-2 search creates only 2 + 4 nodes
    with pytest.raises(ValueError, match="chain"):
        SpecStrategy(3, 1, 5)

    class WrongVocab(HFModelDrafter):
        @property
        def vocab_size(self) -> int:
            return 1000

    with pytest.raises(ValueError, match="vocabulary"):
        make_engine(varied_qwen2, WrongVocab(varied_qwen2[1]))


def test_an_adaptive_policy_whose_strategies_do_not_fit_is_refused_when_attached(varied_qwen2):
    """Checked at attach time, not when a request first comes near max_model_len and the step fails."""
    from verl_tlt.config import SpeculativeConfig
    from verl_tlt.policy.adaptive import AdaptivePolicy

    policy = AdaptivePolicy(SpeculativeConfig(strategies=("8_4_16", "4_1_4")))
    with pytest.raises(ValueError, match="max_draft_tokens"):
        make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1]), max_draft_tokens=8, policy=policy)
    engine = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1]), max_draft_tokens=8)
    with pytest.raises(ValueError, match="8_4_16"):
        engine.policy = policy
    assert engine.policy is None
    engine.policy = AdaptivePolicy(SpeculativeConfig(strategies=("4_1_4",)))  # fits


class FailingDrafter(HFModelDrafter):
    """Works for `ok_calls` expand calls, then raises (a drafter that runs out of memory mid-rollout)."""

    def __init__(self, model, ok_calls: int):
        super().__init__(model)
        self.ok_calls = ok_calls

    def expand(self, node_ids, parent_ids, tokens):
        self.ok_calls -= 1
        if self.ok_calls < 0:
            raise RuntimeError("drafter out of memory (simulated)")
        return super().expand(node_ids, parent_ids, tokens)


@pytest.mark.parametrize("ok_calls", [0, 5])
def test_a_failing_drafter_turns_speculation_off_without_failing_requests(varied_qwen2, ok_calls):
    plain = make_engine(varied_qwen2).generate(PROMPTS, GREEDY)
    engine = make_engine(varied_qwen2, FailingDrafter(varied_qwen2[1], ok_calls))
    outputs = engine.generate(PROMPTS, GREEDY, strategy="4_1_4")
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]
    assert "out of memory" in engine.drafter_error and engine.stats.drafter_failures == 1
    engine.set_drafter(HFModelDrafter(varied_qwen2[1]))  # a new drafter turns speculation back on
    assert engine.drafter_error is None
    assert all(o.stats["num_verify_steps"] > 0 for o in engine.generate(PROMPTS, GREEDY, strategy="4_1_4"))


SAMPLED = SamplingParams(temperature=0.9, top_p=0.9, top_k=20, max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize("strategy", STRATEGIES.values(), ids=STRATEGIES.keys())
@pytest.mark.parametrize("drafter_name", ["perfect", "noisy", "adversarial"])
def test_keyed_sampled_sd_is_token_identical_to_plain(varied_qwen2, strategy, drafter_name):
    # Unseeded requests: keys come from the engine's seed and the order requests arrive in, the same in both engines.
    plain = make_engine(varied_qwen2).generate(PROMPTS, SAMPLED)
    engine = make_engine(varied_qwen2, drafters(varied_qwen2[1])[drafter_name])
    outputs = engine.generate(PROMPTS, SAMPLED, strategy=strategy)
    for sd, ref in zip(outputs, plain, strict=True):
        assert sd.token_ids == ref.token_ids
        assert torch.allclose(torch.tensor(sd.log_probs), torch.tensor(ref.log_probs), atol=1e-5)
        assert sd.stats["num_verify_steps"] > 0
    assert len({tuple(o.token_ids) for o in plain}) == len(PROMPTS)  # really sampled: no two rows alike


def test_keyed_sampling_is_not_greedy_and_differs_between_engine_seeds(varied_qwen2):
    greedy = make_engine(varied_qwen2).generate(PROMPTS, GREEDY)
    first = make_engine(varied_qwen2, seed=0).generate(PROMPTS, SAMPLED)
    again = make_engine(varied_qwen2, seed=0).generate(PROMPTS, SAMPLED)
    other = make_engine(varied_qwen2, seed=1).generate(PROMPTS, SAMPLED)
    tokens = [[o.token_ids for o in run] for run in (greedy, first, again, other)]
    assert tokens[1] == tokens[2]
    assert tokens[1] != tokens[0] and tokens[1] != tokens[3]


def test_keyed_sampling_with_plain_and_sd_steps_mixed_and_greedy_rows_in_the_batch(varied_qwen2):
    params = [SAMPLED, GREEDY, SAMPLED, SamplingParams(temperature=1.3, max_tokens=24, ignore_eos=True), GREEDY]
    reference = make_engine(varied_qwen2, max_num_seqs=8)
    for index, (prompt, p) in enumerate(zip(PROMPTS, params, strict=True)):
        reference.add_request(prompt, p, request_id=str(index))
    engine = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1], noise=0.5), max_num_seqs=8)
    for index, (prompt, p) in enumerate(zip(PROMPTS, params, strict=True)):
        engine.add_request(prompt, p, request_id=str(index))
    expected = {key: o.token_ids for key, o in run_schedule(reference, [None]).items()}
    assert {key: o.token_ids for key, o in run_schedule(engine, MIXED_SCHEDULE).items()} == expected


def test_a_seeded_request_samples_the_same_tokens_in_any_batch_and_with_any_strategy(varied_qwen2):
    seeded = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=1234)
    alone = make_engine(varied_qwen2).generate([PROMPTS[2]], seeded)[0].token_ids
    engine = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1], noise=1.0), max_num_seqs=5)
    for index, prompt in enumerate(PROMPTS):
        engine.add_request(prompt, seeded if index == 2 else SAMPLED, request_id=str(index))
    assert run_schedule(engine, ["4_1_4", None, "3_2_5"])["2"].token_ids == alone
    assert make_engine(varied_qwen2, seed=7).generate([PROMPTS[2]], seeded)[0].token_ids == alone  # seed, not engine


def test_a_perfect_drafter_is_fully_accepted_under_keyed_sampling(varied_qwen2):
    # The drafter draws with the target's noise: when its distribution is the target's, its draws are the target's.
    params = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    engine = make_engine(varied_qwen2, HFModelDrafter(varied_qwen2[1]))
    for output in engine.generate(PROMPTS, params, strategy=SpecStrategy(4)):
        assert output.stats["num_accepted_tokens"] == output.stats["num_draft_tokens"] > 0


def test_an_unknown_sampling_mode_is_refused(varied_qwen2):
    with pytest.raises(ValueError, match="sampling must be one of"):
        make_engine(varied_qwen2, sampling="nucleus")
