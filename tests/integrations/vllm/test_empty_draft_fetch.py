"""The engine core skips the draft fetch after a step that drafted nothing, and only then (stand-in classes with
vLLM's method names; the vLLM tier runs the real ones under every greedy-identity test)."""

from __future__ import annotations

from types import SimpleNamespace

from verl_tlt.integrations.vllm import empty_draft_fetch
from verl_tlt.integrations.vllm.empty_draft_fetch import install, skipped_fetches


def make_classes():
    class Scheduler:
        def __init__(self):
            self.k = 0

        def schedule(self, throttle_prefills: bool = False):
            return SimpleNamespace(num_spec_tokens_to_schedule=self.k, throttled=throttle_prefills)

    class EngineCore:
        def __init__(self):
            self.scheduler, self.batch_queue, self.fetches = Scheduler(), None, 0
            self.use_spec_decode = True

        def post_step(self, model_executed: bool) -> None:
            if model_executed:
                self.fetches += 1  # vLLM's: take_draft_token_ids, one RPC to the workers

    install(Scheduler, EngineCore)
    return Scheduler, EngineCore


def step(core, k: int, executed: bool = True) -> None:
    core.scheduler.k = k
    assert core.scheduler.schedule(throttle_prefills=True).throttled  # arguments and output pass through
    core.post_step(executed)


def test_a_step_that_drafted_nothing_fetches_nothing_and_a_drafting_step_fetches():
    _, EngineCore = make_classes()
    core = EngineCore()
    step(core, 0)
    step(core, 0)
    assert core.fetches == 0 and skipped_fetches(core) == 2
    step(core, 4)
    assert core.fetches == 1
    step(core, 0, executed=False)  # nothing ran: vLLM's own path (which fetches nothing either)
    assert core.fetches == 1 and skipped_fetches(core) == 2


def test_a_batch_queue_or_an_unwrapped_scheduler_keeps_vllms_fetch():
    _, EngineCore = make_classes()
    core = EngineCore()
    core.batch_queue = object()  # pipeline parallel: scheduled ahead of what ran
    step(core, 0)
    assert core.fetches == 1
    bare = EngineCore()
    bare.scheduler = SimpleNamespace()  # a scheduler that never noted its step: fetch as vLLM does
    bare.post_step(True)
    assert bare.fetches == 1


def test_an_engine_without_speculative_decoding_keeps_vllms_path():
    _, EngineCore = make_classes()
    core = EngineCore()
    core.use_spec_decode = False  # e.g. a diffusion model, whose drafts come from the workers at K=0
    step(core, 0)
    assert core.fetches == 1 and skipped_fetches(core) == 0


def test_installing_twice_wraps_once():
    Scheduler, EngineCore = make_classes()
    post_step = EngineCore.post_step
    install(Scheduler, EngineCore)
    assert EngineCore.post_step is post_step


def test_without_the_variable_nothing_is_touched(monkeypatch):
    monkeypatch.delenv(empty_draft_fetch.ENV, raising=False)
    called = []
    monkeypatch.setattr(empty_draft_fetch, "install", lambda *a: called.append(a))
    empty_draft_fetch.register()
    assert called == []
