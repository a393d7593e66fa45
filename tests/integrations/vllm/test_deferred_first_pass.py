"""When the drafter's first pass runs, with a stand-in for vLLM's model runner and proposer (no vLLM needed).

The real thing on vLLM's CPU build: tests/integrations/vllm/test_catch_up_vllm.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from verl_tlt.integrations.vllm.deferred_first_pass import (
    DeferredFirstPass,
    segment_metadata,
    slot_mapping_for,
    unsupported_reason,
)

BLOCK = 4
HIDDEN = 2


@dataclass
class FakeMetadata:
    """The fields of vLLM's CommonAttentionMetadata that deferral reads or replaces."""

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor
    is_prefilling: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    extra: list = field(default_factory=list)

    def batch_size(self) -> int:
        return self.num_reqs


class FakeProposer:
    def __init__(self):
        self.calls: list[dict] = []
        self.max_num_tokens = 64
        self.block_size = BLOCK
        self.num_speculative_tokens = 4

    def propose(self, **kwargs):
        self.calls.append(kwargs)
        batch = kwargs["common_attn_metadata"].batch_size()
        return torch.zeros(batch, kwargs["num_speculative_tokens"], dtype=torch.int64)


def fake_runner(requests: list[str]) -> SimpleNamespace:
    return SimpleNamespace(
        drafter=FakeProposer(),
        speculative_config=SimpleNamespace(method="eagle"),
        parallel_config=SimpleNamespace(data_parallel_size=1),
        input_batch=SimpleNamespace(req_ids=list(requests), num_reqs=len(requests)),
        requests={name: object() for name in requests},
    )


# Request i owns blocks 10 * (i + 1) ... in the block table: its slot for position p is block * BLOCK + p % BLOCK.
BLOCK_TABLE = torch.tensor([[10 + j for j in range(8)], [20 + j for j in range(8)], [30 + j for j in range(8)]])


def step_inputs(queries: list[list[int]], k: int, prompt_rows: tuple[int, ...] = ()) -> dict:
    """propose()'s arguments for a step whose row i queries positions `queries[i]` (token at p = 100 * i + p)."""
    lengths = [len(q) for q in queries]
    qsl = torch.tensor([0, *torch.cumsum(torch.tensor(lengths), 0).tolist()], dtype=torch.int32)
    positions = torch.tensor([p for q in queries for p in q])
    rows = torch.repeat_interleave(torch.arange(len(queries)), torch.tensor(lengths))
    cad = FakeMetadata(
        query_start_loc=qsl.clone(),
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor([q[-1] + 1 for q in queries], dtype=torch.int32),
        num_reqs=len(queries),
        num_actual_tokens=len(positions),
        max_query_len=max(lengths),
        max_seq_len=max(q[-1] + 1 for q in queries),
        block_table_tensor=BLOCK_TABLE[: len(queries)],
        slot_mapping=slot_mapping_for(BLOCK_TABLE, rows, positions, BLOCK),
        is_prefilling=torch.tensor([i in prompt_rows for i in range(len(queries))]),
    )
    return {
        "num_speculative_tokens": k,
        "target_token_ids": torch.tensor([100 * i + p for i, q in enumerate(queries) for p in q]),
        "target_positions": positions,
        "target_hidden_states": positions[:, None].float().repeat(1, HIDDEN),
        "next_token_ids": torch.tensor([100 * i + q[-1] + 1 for i, q in enumerate(queries)]),
        "token_indices_to_sample": None,
        "common_attn_metadata": cad,
        "sampling_metadata": None,
    }


def test_plain_steps_run_no_drafter_pass_and_a_speculative_step_catches_up_first():
    runner = fake_runner(["a", "b"])
    deferral = DeferredFirstPass(runner, window=16).install()
    for p in range(5, 8):
        drafts = runner.drafter.propose(**step_inputs([[p], [p + 3]], k=0))
        assert drafts.shape == (2, 0)
    assert runner.drafter.calls == []  # vLLM's pass never ran
    runner.drafter.propose(**step_inputs([[8], [11]], k=4))
    catch_up, own = runner.drafter.calls
    assert catch_up["num_speculative_tokens"] == 0 and own["num_speculative_tokens"] == 4
    assert catch_up["target_positions"].tolist() == [5, 6, 7, 8, 9, 10]
    assert catch_up["target_token_ids"].tolist() == [5, 6, 7, 108, 109, 110]
    assert catch_up["next_token_ids"].tolist() == [8, 111]  # the tokens the speculative step starts with
    cad = catch_up["common_attn_metadata"]
    assert cad.query_start_loc_cpu.tolist() == [0, 3, 6] and cad.seq_lens.tolist() == [8, 11]
    assert cad.max_query_len == 3 and cad.num_actual_tokens == 6 and cad.num_reqs == 2
    expected = [BLOCK_TABLE[0, p // BLOCK] * BLOCK + p % BLOCK for p in (5, 6, 7)]
    expected += [BLOCK_TABLE[1, p // BLOCK] * BLOCK + p % BLOCK for p in (8, 9, 10)]
    assert cad.slot_mapping.tolist() == [int(s) for s in expected]
    assert deferral.counts["deferred_steps"] == 3 and deferral.counts["caught_up_tokens"] == 6


def test_a_step_with_a_prompt_chunk_runs_vllms_pass_after_catching_up():
    runner = fake_runner(["a", "b"])
    deferral = DeferredFirstPass(runner, window=16).install()
    runner.drafter.propose(**step_inputs([[5], [9]], k=0))
    runner.input_batch.req_ids, runner.input_batch.num_reqs = ["a", "b", "c"], 3  # c arrives
    runner.requests["c"] = object()
    runner.drafter.propose(**step_inputs([[6], [10], [0, 1, 2]], k=0, prompt_rows=(2,)))
    catch_up, own = runner.drafter.calls
    assert catch_up["target_positions"].tolist() == [5, 9]
    assert own["target_positions"].tolist() == [6, 10, 0, 1, 2]
    assert deferral.counts["first_pass_steps"] == 1 and len(deferral.pending) == 0


def test_a_full_window_is_caught_up_during_the_plain_stretch():
    runner = fake_runner(["a"])
    DeferredFirstPass(runner, window=4).install()
    for p in range(10, 19):
        runner.drafter.propose(**step_inputs([[p]], k=0))
    assert [c["target_positions"].tolist() for c in runner.drafter.calls] == [[10, 11, 12, 13], [14, 15, 16, 17]]


def test_a_slot_layout_it_does_not_know_switches_deferral_off():
    runner = fake_runner(["a"])
    deferral = DeferredFirstPass(runner, window=8).install()
    inputs = step_inputs([[5]], k=0)
    inputs["common_attn_metadata"].slot_mapping = inputs["common_attn_metadata"].slot_mapping + 1
    runner.drafter.propose(**inputs)
    assert not deferral.enabled and len(runner.drafter.calls) == 1
    runner.drafter.propose(**step_inputs([[6]], k=0))
    assert len(runner.drafter.calls) == 2  # from now on vLLM's pass runs every step


def test_finished_requests_leave_nothing_behind():
    runner = fake_runner(["a", "b"])
    deferral = DeferredFirstPass(runner, window=8).install()
    runner.drafter.propose(**step_inputs([[5], [9]], k=0))
    del runner.requests["a"]
    runner.input_batch.req_ids, runner.input_batch.num_reqs = ["b"], 1
    runner.drafter.propose(**step_inputs([[10]], k=4))
    assert "a" not in deferral.pending
    assert runner.drafter.calls[0]["target_positions"].tolist() == [9]


def test_segment_metadata_keeps_fields_it_does_not_own():
    inputs = step_inputs([[3], [4]], k=0)
    runner = fake_runner(["a", "b"])
    deferral = DeferredFirstPass(runner, window=8)
    deferral.pending.defer(
        ["a", "b"],
        [0, 1, 2],
        inputs["target_token_ids"],
        inputs["target_positions"],
        inputs["target_hidden_states"],
    )
    segments, _ = deferral.pending.take(["a", "b"], [0, 1, 2], torch.tensor([4, 105]), torch.tensor([4, 5]))
    cad = segment_metadata(inputs["common_attn_metadata"], segments, BLOCK)
    assert cad.extra is inputs["common_attn_metadata"].extra
    assert cad.is_prefilling.tolist() == [False, False]


def test_unsupported_runners_are_named():
    runner = fake_runner(["a"])
    assert unsupported_reason(runner) is None
    runner.speculative_config.method = "ngram"
    assert "ngram" in unsupported_reason(runner)
    runner.speculative_config.method = "eagle3"
    runner.parallel_config.data_parallel_size = 2
    assert "data parallel" in unsupported_reason(runner)
    assert "no drafter" in unsupported_reason(SimpleNamespace())
