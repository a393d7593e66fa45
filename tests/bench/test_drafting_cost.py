"""The drafting-cost measurement of `bench sd curve`: both settings measured, the drafter left as it was found."""

from __future__ import annotations

import pytest

from tests.engine.test_engine_draft_vocab import draft_vocab_engine
from verl_tlt.bench.drafting_cost import drafting_cost
from verl_tlt.engine import SamplingParams


def test_both_heads_are_timed_and_the_draft_vocabulary_is_restored(varied_qwen2):
    engine = draft_vocab_engine(varied_qwen2[0], list(range(3, 40)), max_num_seqs=4)
    vocab = engine.drafter.model.draft_vocab
    cost = drafting_cost(engine, ["3_3_8", "4_1_4"])
    assert cost["strategy"] == "4_1_4" and cost["draft_vocab_size"] == 37  # the first chain; a tree has no depth cost
    drafted, full = cost["us_per_draft_token_draft_vocab"], cost["us_per_draft_token_full_head"]
    assert drafted > 0 and full > 0 and cost["ratio"] == pytest.approx(drafted / full, rel=0.01)
    assert engine.drafter.model.draft_vocab is vocab and engine.max_num_seqs == 4 and not engine.running
    # Nothing stays wrapped: the engine decodes as before, its drafter's calls are the class's own.
    assert "begin" not in vars(engine.drafter) and "forward" not in vars(engine.runner)
    engine.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), strategy="4_1_4")


def test_no_measurement_without_a_draft_vocabulary_or_a_chain(varied_qwen2):
    engine = draft_vocab_engine(varied_qwen2[0], list(range(3, 40)))
    assert drafting_cost(engine, ["3_3_8"]) is None
    engine.drafter.model.set_draft_vocab(None)
    assert drafting_cost(engine, ["4_1_4"]) is None
