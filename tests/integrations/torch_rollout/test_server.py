"""The torch rollout server outside Ray: its engine thread's torch thread count, the end of a validation, and the
weights checksum of traced rollouts."""

from __future__ import annotations

import json
import re
import threading
from types import SimpleNamespace

import pytest
import torch

from tests.engine.conftest import tiny_qwen2  # noqa: F401
from tests.openmp_probe import openmp_max_threads_probe
from verl_tlt.integrations.torch_rollout import server as torch_server
from verl_tlt.integrations.torch_rollout.server import TorchRolloutServer, _build_engine
from verl_tlt.metrics.rollout_trace import RolloutTrace, weights_sha256
from verl_tlt.modeling.model import UnsupportedModelError


class _RolloutConfig(SimpleNamespace):
    def get(self, key, default=None):
        return getattr(self, key, default)


def bare_server(model_path, **torch_kwargs) -> TorchRolloutServer:
    """A server with just what init_engine and the record keeping read (no verl config objects)."""
    server = TorchRolloutServer.__new__(TorchRolloutServer)
    server.replica_rank = 0
    server.model_config = SimpleNamespace(local_path=str(model_path))
    server.config = _RolloutConfig(
        engine_kwargs={"torch": torch_kwargs},
        max_model_len=64,
        prompt_length=16,
        response_length=16,
        dtype="float32",
        max_num_seqs=2,
        logprobs_mode=None,
    )
    server.trace = RolloutTrace(0)
    server.last_rollout = None
    server._seeded = server._grouped = 0
    server._groups = set()
    server._submit_index = {}
    server._trace_path = None
    server._weights_sha256 = None
    server._engine_lock = threading.Lock()
    return server


def init_engine_keeping_threads(server: TorchRolloutServer) -> None:
    """init_engine sets torch's thread count for the server process; the test process keeps its own."""
    previous = torch.get_num_threads()
    try:
        server.init_engine()
    finally:
        torch.set_num_threads(previous)


def test_engine_thread_uses_the_configured_thread_count(tiny_qwen2):  # noqa: F811
    probe = openmp_max_threads_probe()
    server = bare_server(tiny_qwen2[0], num_threads=1)
    seen, done = [], threading.Event()

    def engine_loop():  # stands in for the server's engine loop: report the thread's team size
        seen.append(probe())
        done.set()

    server._run_engine = engine_loop
    previous = torch.get_num_threads()
    try:
        server.init_engine()
        assert done.wait(60), "hang guard: the engine loop did not run within 60 s"
    finally:
        torch.set_num_threads(previous)
    assert seen == [1]


def test_end_validation_keeps_validation_out_of_the_next_training_record(tiny_qwen2, tmp_path):  # noqa: F811
    trace_path = tmp_path / "trace.jsonl"
    server = bare_server(tiny_qwen2[0], trace_path=str(trace_path))
    server._run_engine = lambda: None  # requests are stepped by hand below
    server.init_engine()
    server.drafter_version = lambda: None
    # What a validation rollout leaves behind: an open trace record and decode counters.
    server.trace.on_submit()
    server.trace.on_finish(4, {})
    server.engine.stats.steps_plain = server.engine.stats.tokens_plain = 3
    server.engine.decode_costs.record("plain", batch_size=2, tokens=2, seconds=0.1)

    server.end_validation()

    assert server.engine.stats.steps_plain == 0 and server.last_rollout is None
    (line,) = trace_path.read_text().splitlines()
    record = json.loads(line)
    assert record["validation"] is True and record["response_tokens"] == [4]
    assert record["decode_costs"] == {"2": {"plain": [2, 0.1, 1]}}  # validation's decoding stays in its own record
    server.trace.on_submit()  # the next training rollout starts a record of its own, numbered 0
    server.engine.decode_costs.record("4_1_4", batch_size=1, tokens=3, seconds=0.2)
    server.sleep()
    assert server.last_rollout["rollout_index"] == 0
    assert server.last_rollout["decode_costs"] == {"1": {"4_1_4": [3, 0.2, 1]}}


def _training_rollout_record(server: TorchRolloutServer) -> dict | None:
    server.trace.on_submit()
    server.sleep()
    return server.pop_last_rollout()


def test_a_traced_rollout_records_the_checksum_of_the_weights_it_used(tiny_qwen2, tmp_path):  # noqa: F811
    server = bare_server(tiny_qwen2[0], trace_path=str(tmp_path / "trace.jsonl"))
    server._run_engine = lambda: None
    server.init_engine()
    server.drafter_version = lambda: None
    first = _training_rollout_record(server)["weights_sha256"]
    assert first == weights_sha256(server.engine.model)
    assert _training_rollout_record(server)["weights_sha256"] == first  # nothing loaded in between

    name, view = next(iter(server.engine.model.hf_weight_views().items()))
    server.update_weights([(name, view + 1e-3)])  # what verl's weight sync does after an actor update
    changed = _training_rollout_record(server)["weights_sha256"]
    assert changed != first and changed == weights_sha256(server.engine.model)
    lines = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [line["weights_sha256"] for line in lines] == [first, first, changed]


def test_without_a_trace_path_no_checksum_is_computed(tiny_qwen2, monkeypatch):  # noqa: F811
    server = bare_server(tiny_qwen2[0])
    server._run_engine = lambda: None
    server.init_engine()
    server.drafter_version = lambda: None
    calls = []
    monkeypatch.setattr(torch_server, "weights_sha256", lambda model: calls.append(model) or "x")
    record = _training_rollout_record(server)
    assert record is not None and "weights_sha256" not in record and calls == []


def test_compile_option_reaches_the_engine(tiny_qwen2):  # noqa: F811
    previous = torch.get_num_threads()
    try:
        for flag in (True, False):
            server = bare_server(tiny_qwen2[0], compile=flag)
            server._run_engine = lambda: None  # no engine loop needed
            server.init_engine()
            assert (server.engine.runner.compiled is not None) is flag
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize(
    ("torch_kwargs", "message"),
    [
        ({"compile": "yes"}, "engine_kwargs.torch.compile must be bool, got 'yes'"),
        ({"cuda_graphs": 1}, "engine_kwargs.torch.cuda_graphs must be bool, got 1"),
        ({"num_thread": 2}, "Unknown config key 'actor_rollout_ref.rollout.engine_kwargs.torch.num_thread'"),
        ({"sampling": "nucleus"}, "engine_kwargs.torch.sampling must be 'keyed' | 'rejection', got 'nucleus'"),
    ],
)
def test_bad_engine_kwargs_name_the_key(tiny_qwen2, torch_kwargs, message):  # noqa: F811
    server = bare_server(tiny_qwen2[0], **torch_kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        server.init_engine()


def test_max_num_seqs_is_verls_unless_the_torch_options_set_it(tiny_qwen2):  # noqa: F811
    previous = torch.get_num_threads()
    try:
        for torch_kwargs, expected in (({}, 2), ({"max_num_seqs": 5}, 5)):
            server = bare_server(tiny_qwen2[0], **torch_kwargs)  # verl's max_num_seqs is 2 there
            server._run_engine = lambda: None
            server.init_engine()
            assert server.engine.max_num_seqs == expected
    finally:
        torch.set_num_threads(previous)


def test_a_model_the_engine_cannot_run_names_the_verl_rollout_that_can(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError) as error:
        _build_engine(str(tmp_path))
    message = str(error.value)
    assert f"The model at {tmp_path} (actor_rollout_ref.model.path)" in message and "got 'gpt2'" in message
    assert "Fix: serve it with actor_rollout_ref.rollout.name=vllm" in message


def test_a_request_the_engine_refuses_names_the_verl_rollout_that_serves_it(tiny_qwen2):  # noqa: F811
    import asyncio

    server = bare_server(tiny_qwen2[0])
    server._run_engine = lambda: None
    init_engine_keeping_threads(server)
    request = server.generate([5, 6], {"temperature": 1.0, "presence_penalty": 0.5}, request_id="r0")
    with pytest.raises(ValueError) as error:
        asyncio.run(request)
    assert "['presence_penalty']" in str(error.value)
    assert str(error.value).endswith("or serve it with actor_rollout_ref.rollout.name=vllm.")


def test_a_requests_group_reaches_the_engine_and_the_record_counts_groups(tiny_qwen2):  # noqa: F811
    import asyncio
    import itertools

    from verl_tlt.request_seeds import GROUP_KWARG

    server = bare_server(tiny_qwen2[0])
    server.config.custom = {"tlt": {"enabled": True, "speculative": {"group_drafts": True, "suffix_min_match": 2}}}
    server._ids, server._futures, server._work = itertools.count(), {}, threading.Event()  # what generate uses
    server.global_steps = 1
    init_engine_keeping_threads(server)
    assert server.engine.group_drafts is not None and server.engine.group_drafts.min_match == 2
    added = []
    real_add = server.engine.add_request
    server.engine.add_request = lambda *args, **kwargs: added.append(kwargs["group"]) or real_add(*args, **kwargs)
    server.drafter_version = lambda: None

    async def three_requests():
        params = {"temperature": 0.0, "max_tokens": 2}
        await asyncio.gather(
            server.generate([5, 6], params, request_id="a", **{GROUP_KWARG: "1/7"}),
            server.generate([5, 6], params, request_id="b", **{GROUP_KWARG: "1/7"}),
            server.generate([8, 9], params, request_id="c"),
        )

    asyncio.run(three_requests())
    assert sorted(added, key=str) == ["1/7", "1/7", None]
    server.sleep()
    record = server.pop_last_rollout()
    assert (record["grouped_requests"], record["groups"]) == (2, 1)
    assert (server._grouped, server._groups) == (0, set())


def test_group_drafts_stay_off_with_tlt_off(tiny_qwen2):  # noqa: F811
    server = bare_server(tiny_qwen2[0])
    server.config.custom = {"tlt": {"enabled": False, "speculative": {"group_drafts": True}}}
    server._run_engine = lambda: None
    init_engine_keeping_threads(server)
    assert server.engine.group_drafts is None


def test_the_policy_is_built_at_start_from_tlt_speculative_and_the_drafter_comes_later(tiny_qwen2):  # noqa: F811
    from verl_tlt.policy.adaptive import AdaptivePolicy

    server = bare_server(tiny_qwen2[0])
    server.config.custom = {"tlt": {"enabled": True, "speculative": {"threshold": 3}}}
    server._run_engine = lambda: None
    init_engine_keeping_threads(server)
    assert isinstance(server.engine.policy, AdaptivePolicy) and server.engine.policy.threshold == 3
    assert server.engine.drafter is None and server.engine.group_drafts is None
    server.config.custom = {"tlt": {"enabled": False}}
    init_engine_keeping_threads(server)
    assert server.engine.policy is None


def test_every_engine_option_reaches_the_engines_config(tiny_qwen2):  # noqa: F811
    from dataclasses import fields

    from verl_tlt.engine.config import EngineConfig, EngineOptions

    chosen = {
        "compile": True,
        "cuda_graphs": True,
        "sampling": "rejection",
        "cpu_kernels": "thresholds",
        "cpu_layouts": False,
        "max_draft_tokens": 8,
    }
    assert set(chosen) == {f.name for f in fields(EngineOptions)}  # a new option: add it here
    assert all(getattr(EngineConfig(), name) != value for name, value in chosen.items())  # none is the default
    server = bare_server(tiny_qwen2[0], **chosen)
    server._run_engine = lambda: None
    init_engine_keeping_threads(server)
    assert {name: getattr(server.engine.config, name) for name in chosen} == chosen
    assert (server.engine.config.max_num_seqs, server.engine.config.max_model_len) == (2, 64)  # verl's


def tlt_server(model_path) -> TorchRolloutServer:
    """A bare server with TLT on (a 6-token self-test), ready to serve requests stepped by the test."""
    import itertools

    server = bare_server(model_path)
    server.config.custom = {"tlt": {"enabled": True, "drafter": {"self_test_tokens": 6}}}
    server._ids, server._futures, server._work = itertools.count(), {}, threading.Event()
    server.global_steps, server._drafter_sync = 1, None
    server._run_engine = lambda: None
    init_engine_keeping_threads(server)
    return server


def test_a_corrupted_drafter_is_refused_while_the_rollout_goes_on(tiny_qwen2):  # noqa: F811
    import asyncio

    from verl_tlt.drafter.model import EagleDrafterModel

    server = tlt_server(tiny_qwen2[0])
    generate = asyncio.new_event_loop()

    def serve(prompt):  # one request, stepped here (no engine thread)
        async def one():
            task = asyncio.ensure_future(server.generate(prompt, {"temperature": 0.0, "max_tokens": 3}, "r"))
            await asyncio.sleep(0)
            while server.engine.has_unfinished():
                for output in server.engine.step():
                    loop, future = server._futures.pop(output.request_id)
                    future.set_result(output)
            return await task

        return generate.run_until_complete(one())

    assert len(serve([5, 6, 7]).token_ids) == 3  # the probe prompt is remembered
    server._self_test.reference = 0.8  # as if the last drafter had passed with 80% of its drafts accepted
    server.sleep()
    server.wake_up(tags=["kv_cache"])  # a test is due before the next rollout's first request...
    corrupted = EagleDrafterModel.from_target(server.engine.model).state_dict()
    corrupted["fc.weight"] = torch.full_like(corrupted["fc.weight"], float("nan"))
    assert server.update_drafter(corrupted, version=1) is False
    assert not server._wake_test_due  # ...until the load tested the drafter
    assert server.engine.drafter is None and server.drafter_version() is None
    self_test = server.sd_stats()["self_test"]
    assert (self_test["runs"], self_test["refused"]) == (1, 1)
    assert "of its probe draft tokens" in self_test["last_reason"]
    assert len(serve([8, 9]).token_ids) == 3  # the rollout goes on, decoding plainly
    assert server._self_test.runs == 0  # and the load's test was the step's only one
    generate.close()


def test_a_drafter_that_fails_its_wake_up_self_test_is_dropped(tiny_qwen2):  # noqa: F811
    from tests.engine.drafters import HFModelDrafter
    from verl_tlt.engine.drafter_sync import DrafterSync

    server = bare_server(tiny_qwen2[0])
    server.config.custom = {"tlt": {"enabled": True, "drafter": {"self_test_tokens": 6}}}
    server._run_engine = lambda: None
    init_engine_keeping_threads(server)
    server._self_test.remember([5, 6, 7])
    server._self_test.reference = 0.8
    server._drafter_sync = DrafterSync(server.engine, server._self_test)
    server.engine.set_drafter(HFModelDrafter(tiny_qwen2[1], sign=-1.0))  # what a bad wake-up would leave
    server._drafter_sync.version = 3
    server._tested_since_sleep = False
    server.wake_up(tags=["weights"])  # before the new weights arrive: no test
    server.wake_up(tags=["kv_cache"])  # the test is due before the rollout's first request
    assert server.engine.drafter is not None and server._self_test.runs == 0
    server._wake_up_self_test()
    assert server.engine.drafter is None and server.drafter_version() is None
    assert server.sd_stats()["self_test"]["refused"] == 1


@pytest.mark.parametrize(("affinity", "pinned"), [(True, [1]), (False, [])])
def test_a_server_pins_itself_to_its_replicas_share_of_the_nodes_cores(tiny_qwen2, monkeypatch, affinity, pinned):  # noqa: F811
    """Replica 2 of 2 on a 2-core node takes core 1 (the recorded pin: the test process keeps its own mask)."""
    calls = []
    monkeypatch.setattr(torch_server, "available_cores", lambda: [0, 1])
    monkeypatch.setattr(torch_server, "pin_process", lambda cores: calls.append(list(cores)) or list(cores))
    server = bare_server(tiny_qwen2[0], cpu_affinity=affinity)
    server.node_slot = (1, 2)
    server._run_engine = lambda: None
    init_engine_keeping_threads(server)
    assert calls == ([pinned] if pinned else []) and server.cpu_cores() == pinned


def test_a_server_without_a_node_slot_stays_unpinned(tiny_qwen2, monkeypatch):  # noqa: F811
    monkeypatch.setattr(torch_server, "pin_process", lambda cores: pytest.fail("pinned without a slot"))
    server = bare_server(tiny_qwen2[0])
    server._run_engine = lambda: None
    init_engine_keeping_threads(server)
    assert server.cpu_cores() == []


def test_the_replica_knows_its_slot_among_the_replicas_on_its_node():
    from verl_tlt.integrations.torch_rollout.replica import TorchReplica

    replica = TorchReplica.__new__(TorchReplica)
    replica.gpus_per_node, replica.world_size = 2, 1
    slots = []
    for rank in range(4):
        replica.replica_rank = rank
        slots.append(replica.node_slot())
    assert slots == [(0, 2), (1, 2), (0, 2), (1, 2)]


def test_a_loaded_drafter_gets_timed_step_costs_and_the_first_prompt_probes_it(tiny_qwen2, caplog):  # noqa: F811
    """The first drafter load times the replica's steps; the first rollout's first prompt is remembered before the
    wake-up self-test, so even that rollout's policy knows the drafter's acceptance (and says if it cannot pay)."""
    import asyncio
    import logging

    from verl_tlt.drafter.model import EagleDrafterModel

    server = tlt_server(tiny_qwen2[0])
    policy = server.engine.policy
    assert server.update_drafter(EagleDrafterModel.from_target(server.engine.model).state_dict(), version=0)
    assert policy.costs is not None and {"plain", "4_1_4", "8_4_16"} <= set(policy.costs.table.seconds)
    assert policy.costs.alpha is None  # loaded before any prompt: nothing to probe with yet
    server.wake_up(tags=["kv_cache"])
    loop = asyncio.new_event_loop()

    async def one():
        task = asyncio.ensure_future(server.generate([5, 6, 7], {"temperature": 0.0, "max_tokens": 3}, "r"))
        await asyncio.sleep(0)
        while server.engine.has_unfinished():
            for output in server.engine.step():
                server._futures.pop(output.request_id)[1].set_result(output)
        return await task

    with caplog.at_level(logging.WARNING):
        assert len(loop.run_until_complete(one()).token_ids) == 3
    loop.close()
    assert server._self_test.runs == 1 and policy.costs.prior_alpha == server._self_test.reference is not None
    report = server.sd_stats()["policy"]
    assert set(report) == {"unpaid_plain_steps", "cannot_pay", "arms"}
    if report["cannot_pay"] is not None:  # a random tiny target's drafter: the log says why it decodes plainly
        assert "cannot pay" in caplog.text and "alpha=" in caplog.text


def test_no_wake_up_test_for_a_drafter_the_policy_found_cannot_pay(tiny_qwen2):  # noqa: F811
    """A drafter that cannot pay is used only by the bandit's probes: re-testing it before every rollout would only
    cost the rollout. One that can pay is tested as before."""
    from verl_tlt.policy.cost_model import CostModel, StepCostTable

    server = tlt_server(tiny_qwen2[0])
    policy = server.engine.policy
    table = StepCostTable({"plain": {1: 0.01}, **{name: {1: 0.05} for name in policy.strategies}})
    policy.attach_costs(CostModel(table, policy.strategies, prior_alpha=0.05))
    server._tested_since_sleep = False
    server.wake_up(tags=["kv_cache"])
    assert policy.cannot_pay() is not None and not server._wake_test_due
    policy.new_drafter(0.99)  # a drafter that pays
    server.wake_up(tags=["kv_cache"])
    assert policy.cannot_pay() is None and server._wake_test_due
