"""TLT's vLLM engine set-up on real vLLM (the CPU build): lossless, gated by the threshold, drafters loaded in place.

One engine with TLT's speculative config (the warmed-up toy drafter, K=4 chains below a threshold of 4 running
requests) and one plain engine, both on the cached toy target, shared by the tests of this module. Every test runs
under a hard timeout: a crashed vLLM engine core tends to leave its caller waiting forever.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm")

from tests.vllm_toy_drafter import vllm_tier_drafter  # noqa: E402
from verl_tlt.config import SpeculativeConfig  # noqa: E402
from verl_tlt.metrics.decode_metrics import overall_acceptance as acceptance  # noqa: E402
from verl_tlt.metrics.rollout_metrics import rollout_metrics  # noqa: E402
from verl_tlt.toy.drafter import toy_prompts  # noqa: E402
from verl_tlt.toy.sft import ensure_toy_target  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

THRESHOLD = 4
K = 4
MAX_TOKENS = 160


def chi_square_p_value(rows: list[list[int]]) -> float:
    """Pearson's chi-square test of independence for a 2 x n table (no scipy in vLLM's environment)."""
    import torch

    table = torch.tensor(rows, dtype=torch.float64)
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    statistic = ((table - expected) ** 2 / expected).sum()
    dof = (table.shape[0] - 1) * (table.shape[1] - 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))


@pytest.fixture(scope="module")
def target():
    return str(ensure_toy_target())


@pytest.fixture(scope="module")
def warm_drafter():
    return str(vllm_tier_drafter())


@pytest.fixture(scope="module")
def random_drafter(target, tmp_path_factory):
    import torch
    from transformers import AutoConfig

    from verl_tlt.drafter.export import export_eagle
    from verl_tlt.drafter.model import EagleDrafterModel
    from verl_tlt.modeling.model import ModelSpec

    torch.manual_seed(0)
    model = EagleDrafterModel(ModelSpec.from_hf_config(AutoConfig.from_pretrained(target)))
    return str(export_eagle(model, tmp_path_factory.mktemp("random-drafter") / "drafter"))


@pytest.fixture(scope="module")
def prompts(target):
    return toy_prompts(target, 16, seed=4242)


@pytest.fixture(scope="module")
def engines(target, warm_drafter, monkeypatch_module):
    from verl_tlt.integrations.vllm.local_engine import LocalVllmEngine

    # Lets a test send a function to the workers (to damage the drafter behind the extension's back).
    monkeypatch_module.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    speculative = SpeculativeConfig(threshold=THRESHOLD, strategies=(f"{K}_1_{K}",))
    sd = LocalVllmEngine(target, drafter_dir=warm_drafter, speculative=speculative, max_num_seqs=32)
    plain = LocalVllmEngine(target, max_num_seqs=32)
    yield sd, plain
    sd.close()
    plain.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_greedy_output_with_sd_equals_output_without(engines, prompts):
    sd, plain = engines
    sd.take_stats()
    with_sd = sd.generate(prompts, MAX_TOKENS)
    stats = sd.take_stats()
    without = plain.generate(prompts, MAX_TOKENS)
    assert stats["steps_sd"] > 0 and stats["steps_plain"] > 0  # both paths ran
    assert with_sd.token_ids == without.token_ids


def test_sd_runs_only_below_the_threshold(engines, prompts):
    sd, _ = engines
    sd.take_stats()
    sd.generate(prompts, MAX_TOKENS)
    stats = sd.take_stats()
    assert 0 < stats["max_sd_rows"] <= THRESHOLD
    assert "above_threshold" in stats["strategy_histogram"]
    assert set(stats["strategy_histogram"]["above_threshold"]) == {"plain"}


def test_warmed_up_drafter_accepts_at_least_three_tokens_per_step(engines, prompts):
    sd, _ = engines
    sd.take_stats()
    sd.generate(prompts[:1], MAX_TOKENS)
    assert acceptance(sd.take_stats()) >= 3.0


def test_acceptance_follows_an_in_place_drafter_load_within_the_next_request(
    engines, prompts, warm_drafter, random_drafter
):
    sd, _ = engines
    try:
        results = sd.load_drafter(random_drafter, 1)
        assert [r["version"] for r in results] == [1]
        sd.take_stats()
        sd.generate(prompts[:1], MAX_TOKENS)
        with_random = acceptance(sd.take_stats())
        assert with_random < 1.3  # about 1: a random drafter almost never guesses the target's token
    finally:
        sd.load_drafter(warm_drafter, 2)
    sd.generate(prompts[:1], MAX_TOKENS)
    assert acceptance(sd.take_stats()) >= 3.0


def test_the_drafter_comes_back_after_a_wake_up_with_weights(engines, prompts):
    sd, _ = engines
    sd.load_drafter(vllm_tier_drafter(), 3)  # what a level-2 sleep would have to restore

    def damage(worker):
        model = worker._tlt_draft_model()
        for name, param in model.named_parameters():
            if ".fc." in f".{name}":
                param.data.zero_()

    sd._loop.run_until_complete(sd.engine.collective_rpc(damage))
    sd.take_stats()
    sd.generate(prompts[:1], MAX_TOKENS)
    assert acceptance(sd.take_stats()) < 3.0
    sd._loop.run_until_complete(sd.engine.collective_rpc("wake_up", args=(["weights"],)))
    sd.generate(prompts[:1], MAX_TOKENS)
    assert acceptance(sd.take_stats()) >= 3.0


def test_the_self_test_refuses_a_random_drafter_and_passes_the_warm_one(engines, prompts, random_drafter):
    """What a replica does after a drafter load: the warm drafter passes and sets the reference, a random one (a
    drafter that 'loaded fine' but learned nothing, as after a bad sync) is refused, and no probe reaches the stats."""
    from verl_tlt.engine.drafts.self_test import DrafterSelfTest

    sd, _ = engines
    test = DrafterSelfTest(tokens=32, min_ratio=0.5, max_model_len=1024)
    test.remember(prompts[0])
    sd.load_drafter(vllm_tier_drafter(), 21)
    sd.take_stats()
    sd.counter.take_totals()
    warm = sd.self_test(test)
    assert warm.passed and warm.score.rate >= 0.5, warm
    sd.load_drafter(random_drafter, 22)
    refused = sd.self_test(test)
    assert not refused.passed and refused.score.rate < 0.5 * warm.score.rate, refused
    assert "last passing drafter" in refused.reason
    sd.load_drafter(vllm_tier_drafter(), 23)
    assert sd.self_test(test).passed
    assert sd.counter.take_totals()["num_draft_tokens"] == 0 and sd.take_stats()["steps_sd"] == 0


def test_a_drafter_that_does_not_fit_is_refused_and_the_previous_one_keeps_running(engines, prompts, tmp_path):
    from safetensors.torch import save_file

    sd, _ = engines
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file({"fc.weight": __import__("torch").zeros(3, 3)}, str(bad / "model.safetensors"))
    with pytest.raises(Exception, match="(?i)size|shape"):  # vLLM's loader names the mismatch
        sd.load_drafter(str(bad), 9)
    sd.take_stats()
    sd.generate(prompts[:1], MAX_TOKENS)
    assert acceptance(sd.take_stats()) >= 3.0


def test_tlt_sd_metrics_are_present_and_finite(engines, prompts):
    sd, _ = engines
    sd.take_stats()
    sd.generate(prompts, MAX_TOKENS)
    stats = sd.take_stats()
    totals = sd.counter.take_totals()
    record = {"start": 0.0, "closed": 1.0, "finish_times": [1.0], "response_tokens": [1], "sd": totals}
    metrics = rollout_metrics([record], [stats])
    for key in ("tlt/sd/acceptance_length", "tlt/sd/step_share", "tlt/sd/token_share", f"tlt/sd/strategy/{K}_1_{K}"):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert 0 < metrics["tlt/sd/step_share"] < 1
    # Over a whole batch, rows that end a response inside a draft commit fewer tokens than the single-request test.
    assert metrics["tlt/sd/acceptance_length"] > 2.0


def test_sampled_sd_has_the_distribution_of_plain_sampling(engines, prompts):
    """Two-sample chi-square per position over 600 sampled continuations of one prompt, SD vs plain.

    Batches of `THRESHOLD` requests, so every decode step of the SD engine speculates. Rare tokens are pooled so
    every cell expects >= 5; positions are Bonferroni-corrected.
    """
    sd, plain = engines
    prompt, samples, length = prompts[0], 600, 6
    chunks = range(0, samples, THRESHOLD)
    sd.take_stats()
    with_sd = [
        t for i in chunks for t in sd.generate([prompt] * THRESHOLD, length, temperature=1.0, seed=10_000 + i).token_ids
    ]
    stats = sd.take_stats()
    without = [
        t
        for i in chunks
        for t in plain.generate([prompt] * THRESHOLD, length, temperature=1.0, seed=90_000 + i).token_ids
    ]
    # Speculation produced the sample: each request's first token comes from its prefill (a plain step), and nearly
    # every later one from a speculative step. A share of tokens, not a count of steps: how vLLM splits admissions
    # into steps varies from run to run by a step or two.
    later_tokens = stats["tokens_sd"] + stats["tokens_plain"] - samples
    assert stats["tokens_sd"] >= 0.9 * later_tokens, stats
    p_values = position_p_values(with_sd, without, length)
    assert p_values, "the toy target was deterministic at every position: no distribution to compare"
    assert min(p_values) > 0.001 / len(p_values), p_values
    # The test has power: plain sampling at temperature 1.6 (what garbled per-request temperatures would look like)
    # is told apart from T=1 by the same statistic. Heated, not cooled: the toy target is trained on the host and is
    # so sure of most tokens that cooling moves little mass (T=0.6 gave p=0.003 on an AMX Xeon, above the bound),
    # while heating a 1% token makes it about 5% (6 against about 32 of 600), p about 1e-5.
    hotter = [
        t
        for i in chunks
        for t in plain.generate([prompt] * THRESHOLD, length, temperature=1.6, seed=50_000 + i).token_ids
    ]
    assert min(position_p_values(hotter, without, length)) < 0.001 / len(p_values)


def position_p_values(first: list[list[int]], second: list[list[int]], length: int) -> list[float]:
    """Chi-square p-value per position 1..length-1 of two samples of sequences; tokens seen < 10 times pooled."""
    from collections import Counter

    p_values = []
    for position in range(1, length):
        a = Counter(seq[position] for seq in first if len(seq) > position)
        b = Counter(seq[position] for seq in second if len(seq) > position)
        tokens = sorted(set(a) | set(b), key=lambda t: -(a[t] + b[t]))
        common = [t for t in tokens if a[t] + b[t] >= 10]
        rows = [[a[t] for t in common], [b[t] for t in common]]
        rest = [sum(a.values()) - sum(rows[0]), sum(b.values()) - sum(rows[1])]
        if sum(rest) >= 10:
            rows[0].append(rest[0])
            rows[1].append(rest[1])
        if len(rows[0]) >= 2:  # one token only: nothing to compare at this position
            p_values.append(chi_square_p_value(rows))
    return p_values
