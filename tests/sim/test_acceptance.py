"""Acceptance models: chains by per-position probability, trees by a measured table, both scaled by quality."""

from __future__ import annotations

import random
import statistics

import pytest

from verl_tlt.sim.acceptance import ChainAcceptance, TableAcceptance, alpha_for_length, expected_committed
from verl_tlt.spec.strategy import SpecStrategy

TABLE = TableAcceptance({(8, 16): 6.0, (8, 48): 7.0, (4, 16): 4.0})


def test_the_table_gives_measured_entries_and_interpolates_in_verify_tokens():
    assert TABLE.expected(SpecStrategy.parse("8_4_16")) == 6.0
    assert TABLE.expected(SpecStrategy.parse("8_4_32")) == pytest.approx(6.5)
    assert TABLE.expected(SpecStrategy.parse("8_4_64")) == 7.0  # clamped beyond the last entry


def test_another_depth_takes_the_nearest_measured_depth_and_never_exceeds_depth_plus_one():
    assert TABLE.expected(SpecStrategy.parse("3_4_16")) == 4.0  # nearest depth 4: 4.0 = depth + 1 of 3
    assert TABLE.expected(SpecStrategy.parse("2_2_4")) == 3.0  # capped at depth + 1


def test_quality_scales_the_drafted_part_but_not_suffix_drafts():
    half = TABLE.scaled(0.5)
    assert half.expected(SpecStrategy.parse("8_4_16")) == pytest.approx(1 + 0.5 * 5.0)
    chains = ChainAcceptance({"eagle": 0.5, "suffix": 0.5}).scaled(0.0)
    assert chains.expected(SpecStrategy.parse("4_1_4")) == 1.0
    assert chains.expected(SpecStrategy.parse("suffix:4_1_4")) == pytest.approx(expected_committed(0.5, 4))


def test_draws_have_the_expected_mean():
    rng = random.Random(0)
    strategy = SpecStrategy.parse("8_4_48")
    mean = statistics.fmean(TABLE.draw(strategy, rng) for _ in range(20000))
    assert mean == pytest.approx(7.0, rel=0.02)


def test_alpha_for_length_inverts_the_chain_formula():
    assert expected_committed(alpha_for_length(3.3, 6), 6) == pytest.approx(3.3)
    with pytest.raises(ValueError, match="depth"):
        alpha_for_length(9.0, 6)


def test_impossible_entries_and_sources_are_refused():
    with pytest.raises(ValueError, match="outside"):
        TableAcceptance({(2, 4): 5.0})
    with pytest.raises(ValueError, match="source"):
        ChainAcceptance({"ngram": 0.5})
    with pytest.raises(ValueError, match="quality"):
        TABLE.scaled(1.5)
