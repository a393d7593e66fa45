"""K=0 steps without the drafter and the catch-up when it drafts again, on vLLM's CPU build (toy target).

Engines: TLT's gated engine (K=4 up to 4 running requests) with the deferred first pass, the same with vLLM's pass
every step (the reference a caught-up drafter must match), one whose schedule goes speculative -> plain ->
speculative as the batch drains (with a window of 4 positions, so the plain stretch also fills windows), one whose
KV cache is too small for its batch (vLLM preempts), and a plain engine. Greedy outputs must equal plain decoding's
on every path; sampled ones must keep its distribution.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("vllm")

from tests.integrations.vllm.test_local_engine import position_p_values  # noqa: E402
from tests.vllm_toy_drafter import vllm_tier_drafter  # noqa: E402
from verl_tlt.config import SpeculativeConfig  # noqa: E402
from verl_tlt.metrics.decode_metrics import overall_acceptance as acceptance  # noqa: E402
from verl_tlt.toy.drafter import toy_prompts  # noqa: E402
from verl_tlt.toy.sft import ensure_toy_target  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

THRESHOLD, K, MAX_TOKENS = 4, 4, 160
ON_OFF_ON = [[1, 2, K], [3, 6, 0], [7, 32, K]]  # speculate with a full batch, plain while it drains, then again
PLAIN_ABOVE_2 = [[1, 2, K], [3, 32, 0]]


@pytest.fixture(scope="module")
def setup():
    from verl_tlt.integrations.vllm.local_engine import LocalVllmEngine

    target, drafter = str(ensure_toy_target()), str(vllm_tier_drafter())
    speculative = SpeculativeConfig(threshold=THRESHOLD, strategies=(f"{K}_1_{K}",))
    common = {"drafter_dir": drafter, "speculative": speculative, "max_num_seqs": 32}
    engines = {
        "deferred": LocalVllmEngine(target, catch_up_window=64, **common),
        "every_step": LocalVllmEngine(target, catch_up_window=0, **common),
        "on_off_on": LocalVllmEngine(target, catch_up_window=4, schedule=ON_OFF_ON, **common),
        "preempting": LocalVllmEngine(
            target, catch_up_window=64, schedule=PLAIN_ABOVE_2, num_kv_blocks=4, max_model_len=512, **common
        ),
        "plain": LocalVllmEngine(target, max_num_seqs=32),
    }
    yield engines, toy_prompts(target, 16, seed=4242), drafter
    for engine in engines.values():
        engine.close()


def counts(engine) -> dict:
    (stats,) = engine.catch_up_stats()
    return stats


def test_the_deferral_is_installed_and_reported(setup):
    engines, _, _ = setup
    assert [r["installed"] for r in engines["deferred"].catch_up] == [True]
    assert engines["every_step"].catch_up == []  # window 0: vLLM's own pass, nothing installed


def test_plain_then_speculative_is_greedy_identical_and_the_drafter_caught_up(setup):
    engines, prompts, _ = setup
    before = counts(engines["deferred"])
    engines["deferred"].take_stats()
    out = engines["deferred"].generate(prompts, MAX_TOKENS)
    stats, after = engines["deferred"].take_stats(), counts(engines["deferred"])
    assert out.token_ids == engines["plain"].generate(prompts, MAX_TOKENS).token_ids
    assert stats["steps_sd"] > 0 and stats["steps_plain"] > 0
    assert after["deferred_steps"] > before.get("deferred_steps", 0)  # plain steps ran no drafter
    assert after["catch_ups"] > before.get("catch_ups", 0)  # and it caught up before drafting


def test_acceptance_after_catch_up_matches_a_drafter_that_ran_every_step(setup):
    engines, prompts, _ = setup
    rates = {}
    for name in ("deferred", "every_step"):
        engines[name].take_stats()
        engines[name].generate(prompts, MAX_TOKENS)
        rates[name] = acceptance(engines[name].take_stats())
    assert rates["every_step"] >= 3.0, rates  # a warm drafter: the comparison means something
    assert rates["deferred"] >= 0.95 * rates["every_step"], rates


def test_speculative_plain_speculative_with_full_windows_is_greedy_identical(setup):
    engines, prompts, _ = setup
    engine = engines["on_off_on"]
    before = counts(engine)
    engine.take_stats()
    out = engine.generate(prompts, MAX_TOKENS)
    stats, after = engine.take_stats(), counts(engine)
    assert out.token_ids == engines["plain"].generate(prompts, MAX_TOKENS).token_ids
    assert stats["steps_sd"] > 0 and after["deferred_steps"] > before.get("deferred_steps", 0)
    # Plain stretches longer than the 4-position window are caught up while they last: more passes than stretches.
    assert after["catch_ups"] - before.get("catch_ups", 0) >= 2
    assert acceptance(stats) >= 3.0


def _stream(engine, prompt: list[int], request_id: str, max_tokens: int, progress: list[int]):
    """One request on the engine's own loop; `progress[0]` counts its streamed outputs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    async def run() -> list[int]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, detokenize=False)
        final = None
        async for output in engine.engine.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id):
            final = output
            progress[0] += 1
        return list(final.outputs[0].token_ids)

    return run()


def test_a_sleep_a_drafter_load_and_requests_joining_inside_a_plain_stretch_keep_it_exact(setup):
    """The twelve prompts with the longest answers start (plain above the threshold); a few steps in, the engine
    sleeps with its requests kept (vLLM's pause mode "keep"; on CPU the workers' own sleep is a no-op, the
    scheduler's pause is not), the drafter is loaded again and four more requests arrive; the wake-up (which
    restores the drafter's weights in every worker) resumes the batch, which drains into speculation. While the
    engine sleeps nothing steps, so what is stored then is what the catch-up after the wake-up must use."""
    engines, prompts, drafter = setup
    engine = engines["deferred"]
    reference = engines["plain"].generate(prompts, MAX_TOKENS).token_ids
    order = sorted(range(len(prompts)), key=lambda i: -len(reference[i]))
    first_wave, joiners = order[:12], order[12:]
    assert len(reference[first_wave[0]]) >= 40  # steps enough after the trigger that the sleep lands mid-stretch

    async def scenario() -> tuple[dict[int, list[int]], int]:
        progress = {i: [0] for i in first_wave}
        first = {
            i: asyncio.ensure_future(_stream(engine, prompts[i], f"join-a{i}", MAX_TOKENS, progress[i]))
            for i in first_wave
        }
        while min(count[0] for count in progress.values()) < 3:  # every request a few plain steps past its prompt
            await asyncio.sleep(0.002)
        await engine.engine.sleep(level=1, mode="keep")
        (asleep,) = await engine.engine.collective_rpc("tlt_catch_up_stats")
        await engine.engine.collective_rpc("tlt_load_drafter", args=(drafter, 77))
        second = {i: asyncio.ensure_future(_stream(engine, prompts[i], f"join-b{i}", MAX_TOKENS, [0])) for i in joiners}
        await asyncio.sleep(0.05)  # the joiners reach the engine core while it sleeps
        await engine.engine.wake_up()
        done = dict(zip([*first, *second], await asyncio.gather(*first.values(), *second.values()), strict=True))
        return done, asleep["pending_requests"]

    engine.take_stats()
    before = counts(engine)
    outputs, pending_asleep = engine._loop.run_until_complete(asyncio.wait_for(scenario(), 600))
    stats, after = engine.take_stats(), counts(engine)
    assert pending_asleep > 0  # the sleep, the load and the arrivals came while the drafter had positions stored
    assert [outputs[i] for i in range(len(prompts))] == reference
    assert after["catch_ups"] > before.get("catch_ups", 0)
    assert stats["steps_sd"] > 0 and acceptance(stats) >= 3.0


def test_preempted_requests_stay_exact(setup):
    """Eight copies of the prompt with the longest answer on a KV cache of 4 blocks (of 128 positions on CPU): four
    run (plain: the engine speculates at 2 or fewer), one block each, and the first to need a second block finds none
    free, so vLLM preempts a request (whatever the order the requests arrived in) and recomputes it later, after its
    drafter context was stored; the batch then drains into speculation."""
    engines, prompts, _ = setup
    engine = engines["preempting"]
    reference = engines["plain"].generate(prompts, MAX_TOKENS).token_ids
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]) + len(reference[i]))
    assert len(prompts[longest]) + len(reference[longest]) > 128 + K  # it needs a second block
    engine.take_stats()
    out = engine.generate([prompts[longest]] * 8, MAX_TOKENS)
    assert engine.counter.preempted_requests > 0
    assert out.token_ids == [reference[longest]] * 8
    assert engine.take_stats()["steps_sd"] > 0


def test_sampled_speculation_after_a_catch_up_has_the_distribution_of_plain_sampling(setup):
    """Per batch: four short filler requests keep the batch above the threshold for the first tokens (plain steps,
    drafter deferred), then four requests of one prompt speculate after the catch-up. Chi-square per position
    against plain sampling, with the negative control of test_local_engine (T=1.6 is told apart)."""
    engines, prompts, _ = setup
    sd, plain = engines["deferred"], engines["plain"]
    prompt, samples, length, fillers = prompts[0], 400, 8, prompts[1:5]

    def sample(engine, temperature: float, seed: int) -> list[list[int]]:
        out = []
        for i in range(0, samples, THRESHOLD):
            batch = engine.generate(
                [prompt] * THRESHOLD + fillers,
                [length] * THRESHOLD + [3] * len(fillers),
                temperature=temperature,
                seed=seed + 10 * i,
            )
            out += batch.token_ids[:THRESHOLD]
        return out

    before = counts(sd)
    with_sd = sample(sd, 1.0, 10_000)
    after = counts(sd)
    assert after["catch_ups"] - before.get("catch_ups", 0) >= samples // THRESHOLD // 2  # most batches caught up
    without = sample(plain, 1.0, 90_000)
    p_values = position_p_values(with_sd, without, length)
    assert p_values and min(p_values) > 0.001 / len(p_values), p_values
    assert min(position_p_values(sample(plain, 1.6, 50_000), without, length)) < 0.001 / len(p_values)
