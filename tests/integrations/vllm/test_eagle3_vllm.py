"""EAGLE-3 drafters on real vLLM (the CPU build), on a Qwen3 target (which vLLM's EAGLE-1 path cannot serve).

The engine starts as TLT's server starts it with `tlt.drafter.init=target`: from the untrained drafter, whose head
over the whole vocabulary equals the target's, so vLLM shares the target's head with it. Then a drafter trained here
is loaded in place (its own head and map included): greedy outputs equal plain decoding, vLLM accepts what the torch
engine accepts with the same export (it means the same model in both), loads take effect without ever touching the
target's head, and the drafter comes back after a wake-up. (The toy's Qwen2 target through the same path:
`verl-tlt bench sd families --engine vllm`, docs/benchmarks.md.) Every engine runs under a hard timeout.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from verl_tlt.config import DrafterConfig, SpeculativeConfig  # noqa: E402
from verl_tlt.drafter.data import DrafterDataBuffer, DrafterSample  # noqa: E402
from verl_tlt.drafter.family import export_drafter, new_drafter  # noqa: E402
from verl_tlt.drafter.trainer import DrafterTrainer  # noqa: E402
from verl_tlt.engine import RolloutEngine, SamplingParams  # noqa: E402
from verl_tlt.engine.drafts.eagle import EagleDrafter  # noqa: E402
from verl_tlt.metrics.decode_metrics import overall_acceptance as acceptance  # noqa: E402
from verl_tlt.modeling.model import sequence_hidden_states  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

K = 4
MAX_TOKENS = 48
PROMPTS = [[1, 5 + i, 17 + 2 * i, 9 + 3 * i] for i in range(8)]


def build_qwen3(path) -> str:
    """A random 5-layer Qwen3 (q/k norms; head_dim 32, which vLLM's CPU attention supports)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=256,
        hidden_size=128,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # wide weights: outputs that depend on the context, so drafting is not trivial
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.2)
            elif "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    return str(path)


def trained_eagle3(target: str, out, steps: int = 80):
    """(trained export, untrained export) of EAGLE-3 drafters for `target`, the trained one fitted to the target's
    greedy answers to PROMPTS."""
    engine = RolloutEngine.from_pretrained(target, max_num_seqs=8)
    # The whole vocabulary: the untrained export's head is then the target's, which vLLM shares (see the docstring).
    config = DrafterConfig(family="eagle3", lr=3e-3, max_tokens_per_batch=256, draft_vocab_size=256)
    torch.manual_seed(0)
    model = new_drafter(engine.model, "eagle3", draft_vocab_size=config.draft_vocab_size)
    untrained = export_drafter(model, out / "untrained")
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    engine.model.feature_layers = model.aux_layers
    samples = []
    for prompt, output in zip(PROMPTS, engine.generate(PROMPTS, params), strict=True):
        ids = prompt + output.token_ids
        hidden = sequence_hidden_states(engine.model, ids)
        samples.append(DrafterSample(torch.tensor(ids), hidden, torch.arange(len(ids)) >= len(prompt)))
    engine.model.feature_layers = ()
    trainer = DrafterTrainer(model, DrafterDataBuffer(100_000), config)
    trainer.add_samples(samples)
    trainer.train(max_steps=steps)
    return export_drafter(model, out / "trained"), untrained


def torch_acceptance(target: str, drafter) -> float:
    from verl_tlt.drafter.family import load_drafter

    engine = RolloutEngine.from_pretrained(target, max_num_seqs=8)
    engine.set_drafter(EagleDrafter(load_drafter(drafter, engine.model)))
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = engine.generate(PROMPTS, params, strategy=f"{K}_1_{K}")
    steps = sum(o.stats["num_verify_steps"] for o in outputs)
    return (steps + sum(o.stats.get("num_accepted_tokens", 0) for o in outputs)) / steps


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from verl_tlt.integrations.vllm.local_engine import LocalVllmEngine

    root = tmp_path_factory.mktemp("eagle3-qwen3")
    target = build_qwen3(root / "target")
    trained, untrained = trained_eagle3(target, root)
    plain = LocalVllmEngine(target, max_num_seqs=8)
    expected = plain.generate(PROMPTS, MAX_TOKENS).token_ids
    plain.close()
    speculative = SpeculativeConfig(threshold=8, strategies=(f"{K}_1_{K}",))
    import os

    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # lets a test send a function to the workers
    sd = LocalVllmEngine(target, drafter_dir=str(untrained), speculative=speculative, max_num_seqs=8)
    sd.load_drafter(str(trained), 100)
    yield target, sd, expected, trained, untrained
    sd.close()


def test_vllm_serves_the_eagle3_export_greedy_identically_and_accepts_what_the_torch_engine_does(setup):
    target, sd, expected, trained, _ = setup
    sd.take_stats()
    assert sd.generate(PROMPTS, MAX_TOKENS).token_ids == expected
    served = acceptance(sd.take_stats())
    assert served > 1.3, served  # the trained drafter drafts: its map, head and layers reached vLLM
    assert served == pytest.approx(torch_acceptance(target, trained), abs=0.1)


def test_in_place_loads_of_the_head_and_map_take_effect_and_never_touch_the_target(setup):
    target, sd, expected, trained, untrained = setup
    sd.take_stats()
    sd.generate(PROMPTS, MAX_TOKENS)
    with_trained = acceptance(sd.take_stats())
    try:
        assert [r["version"] for r in sd.load_drafter(str(untrained), 101)] == [101]
        assert sd.generate(PROMPTS, MAX_TOKENS).token_ids == expected
        with_untrained = acceptance(sd.take_stats())
        assert with_untrained < with_trained - 0.2, (with_untrained, with_trained)
    finally:
        sd.load_drafter(str(trained), 102)
    assert sd.generate(PROMPTS, MAX_TOKENS).token_ids == expected
    assert acceptance(sd.take_stats()) == pytest.approx(with_trained, abs=0.05)


def test_the_eagle3_drafter_comes_back_after_a_wake_up_with_weights(setup):
    _, sd, expected, trained, _ = setup
    sd.load_drafter(str(trained), 103)
    sd.take_stats()
    sd.generate(PROMPTS, MAX_TOKENS)
    before = acceptance(sd.take_stats())

    def damage(worker):
        model = worker._tlt_draft_model()
        model.model.fc.weight.data.zero_()  # what a level-2 sleep leaves of the drafter

    sd._loop.run_until_complete(sd.engine.collective_rpc(damage))
    sd.generate(PROMPTS, MAX_TOKENS)
    assert acceptance(sd.take_stats()) < before - 0.2
    sd._loop.run_until_complete(sd.engine.collective_rpc("wake_up", args=(["weights"],)))
    assert sd.generate(PROMPTS, MAX_TOKENS).token_ids == expected
    assert acceptance(sd.take_stats()) == pytest.approx(before, abs=0.05)


def test_the_eagle3_drafter_catches_up_after_plain_steps_as_if_it_had_run_every_step(setup):
    """A batch that drains speculative -> plain -> speculative (answers capped at different lengths): with the first
    pass deferred on the plain steps (its feature layers' hidden states stored, then caught up) the outputs are plain
    decoding's and the acceptance that of an engine whose drafter ran every step."""
    from verl_tlt.integrations.vllm.local_engine import LocalVllmEngine

    target, _, _, trained, _ = setup
    caps = [MAX_TOKENS - 4 * i for i in range(len(PROMPTS))]
    plain = LocalVllmEngine(target, max_num_seqs=8)
    expected = plain.generate(PROMPTS, caps).token_ids
    plain.close()
    speculative = SpeculativeConfig(threshold=8, strategies=(f"{K}_1_{K}",))
    rates = {}
    for window in (64, 0):
        engine = LocalVllmEngine(
            target,
            drafter_dir=str(trained),
            speculative=speculative,
            max_num_seqs=8,
            schedule=[[1, 2, K], [3, 6, 0], [7, 8, K]],
            catch_up_window=window,
        )
        try:
            engine.take_stats()
            assert engine.generate(PROMPTS, caps).token_ids == expected
            rates[window] = acceptance(engine.take_stats())
            if window:
                (counts,) = engine.catch_up_stats()
                assert counts["deferred_steps"] > 0 and counts["catch_ups"] > 0, counts
        finally:
            engine.close()
    assert rates[0] > 1.3, rates  # the drafter drafts: the comparison means something
    assert rates[64] >= 0.95 * rates[0], rates
