"""TLT's vLLM server lends a drained replica's KV cache to a drafter burst and takes it back (a fake engine: the
CPU build cannot sleep, so the calls, their order and the race with a late request are what is checked)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from verl.workers.rollout.replica import RolloutMode  # noqa: E402

from verl_tlt.integrations.vllm import server as server_module  # noqa: E402
from verl_tlt.integrations.vllm.server import TLTvLLMHttpServer  # noqa: E402

pytestmark = pytest.mark.vllm


class FakeEngine:
    def __init__(self, sleep_s: float = 0.0, fail_sleep: bool = False):
        self.calls: list[str] = []
        self.sleep_s, self.fail_sleep = sleep_s, fail_sleep

    async def sleep(self, level: int = 1):
        self.calls.append(f"sleep{level}")
        await asyncio.sleep(self.sleep_s)
        if self.fail_sleep:
            raise RuntimeError("sleep failed")

    async def wake_up(self, tags=None):
        self.calls.append(f"wake:{','.join(tags) if tags else 'all'}")

    async def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")


def make_server(monkeypatch, engine: FakeEngine, *, free_cache_engine=True, mode=RolloutMode.HYBRID):
    monkeypatch.setattr(server_module, "_is_cpu_build", lambda: False)
    server = TLTvLLMHttpServer.__new__(TLTvLLMHttpServer)
    server.engine, server.rollout_mode, server.node_rank = engine, mode, 0
    server.config = SimpleNamespace(free_cache_engine=free_cache_engine)
    server._kv_lent, server._kv_lock, server._in_flight = False, asyncio.Lock(), 0
    return server


def test_a_drained_replica_frees_its_kv_cache_and_has_it_back(monkeypatch):
    engine = FakeEngine()
    server = make_server(monkeypatch, engine)

    async def cycle():
        assert await server.free_for_training() is True
        assert await server.free_for_training() is False  # lent already
        await server.restore_after_training()
        await server.restore_after_training()  # once

    asyncio.run(cycle())
    assert engine.calls == ["sleep1", "wake:weights", "wake:kv_cache", "reset_prefix_cache"]


def test_nothing_is_lent_where_verl_does_not_sleep_the_engine_or_a_request_is_in_flight(monkeypatch):
    for kwargs in ({"free_cache_engine": False}, {"mode": RolloutMode.COLOCATED}):
        engine = FakeEngine()
        assert asyncio.run(make_server(monkeypatch, engine, **kwargs).free_for_training()) is False
        assert engine.calls == []
    engine = FakeEngine()
    busy = make_server(monkeypatch, engine)
    busy._in_flight = 1
    assert asyncio.run(busy.free_for_training()) is False and engine.calls == []


def test_a_request_arriving_during_the_sleep_waits_and_takes_the_kv_cache_back_first(monkeypatch):
    engine = FakeEngine(sleep_s=0.05)
    server = make_server(monkeypatch, engine)

    async def race():
        lend = asyncio.create_task(server.free_for_training())
        await asyncio.sleep(0.01)  # the sleep is under way
        assert server._kv_lent  # what a request arriving now checks first (generate)
        await server.restore_after_training()  # what that request does: waits for the lending to end
        assert await lend is True

    asyncio.run(race())
    assert engine.calls == ["sleep1", "wake:weights", "wake:kv_cache", "reset_prefix_cache"]
    assert not server._kv_lent


def test_a_failed_sleep_wakes_everything_and_lends_nothing(monkeypatch):
    engine = FakeEngine(fail_sleep=True)
    server = make_server(monkeypatch, engine)
    with pytest.raises(RuntimeError, match="sleep failed"):
        asyncio.run(server.free_for_training())
    assert engine.calls == ["sleep1", "wake:all"] and not server._kv_lent
