"""The self-test timing of `bench sd curve`: the first and a later check timed, the engine left empty."""

from __future__ import annotations

from tests.engine.drafters import HFModelDrafter
from verl_tlt.bench.self_test_cost import self_test_cost
from verl_tlt.engine import RolloutEngine


def test_the_first_and_a_later_check_are_timed(varied_qwen2):
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]), drafter=HFModelDrafter(varied_qwen2[1]))
    cost = self_test_cost(engine, [5, 6, 7])
    assert cost["probe_tokens"] == 32 and cost["positions"] == 16 and cost["agreement"] == 1.0  # a perfect drafter
    assert cost["first_check_s"] > 0 and cost["check_s"] > 0 and not engine.has_unfinished()


def test_no_timing_when_the_prompt_leaves_no_room(varied_qwen2):
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]), drafter=HFModelDrafter(varied_qwen2[1]))
    assert self_test_cost(engine, [5] * (engine.max_model_len - 8)) is None
