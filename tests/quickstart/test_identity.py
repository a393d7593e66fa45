"""The identity claim per run and step (weights bitwise equal to the baseline's? responses equal?), from synthetic
rows and responses."""

from __future__ import annotations

from verl_tlt.quickstart.identity import (
    identity_by_run,
    identity_claim,
    responses_by_step,
    same_responses_steps,
    step_identity,
)


def _rows(digests: list[str | None]) -> list[dict]:
    return [{"step": i + 1, "weights_sha256": digest} for i, digest in enumerate(digests)]


def _responses(outputs: list[str]) -> dict[int, list[tuple[str, str]]]:
    return {i + 1: [("p", output)] for i, output in enumerate(outputs)}


BASE_ROWS, BASE_RESPONSES = _rows(["w1", "w2", "w3", "w4"]), _responses(["a", "b", "c", "d"])


def test_responses_are_compared_in_a_canonical_order_whatever_order_verl_dumped_them():
    dumped = {1: [{"input": "q", "output": "y", "score": 1}, {"input": "p", "output": "x", "score": 0}]}
    reordered = {1: [{"input": "p", "output": "x"}, {"input": "q", "output": "y"}]}
    assert responses_by_step(dumped) == responses_by_step(reordered) == {1: [("p", "x"), ("q", "y")]}


def test_same_responses_steps_counts_the_steps_each_run_sampled_like_the_baseline():
    baseline = {1: [("p", "a"), ("q", "b")], 2: [("p", "c")]}
    responses = {"baseline": baseline, "tlt": dict(baseline), "frozen": {1: baseline[1], 2: [("p", "d")]}}
    assert same_responses_steps(responses) == {"tlt": "2/2", "frozen": "1/2"}
    assert same_responses_steps({"baseline": baseline, "tlt": {1: baseline[1]}}) == {"tlt": "1/2"}


def test_a_run_that_diverges_in_training_keeps_the_claim_up_to_the_divergence():
    # Weights equal at steps 1-2, then training drifted: responses differ from step 3 on, which is allowed.
    steps = step_identity(BASE_ROWS, _rows(["w1", "w2", "x3", "x4"]), BASE_RESPONSES, _responses(["a", "b", "C", "d"]))
    assert [(s["weights_equal"], s["responses_equal"]) for s in steps] == [
        (True, True),
        (True, True),
        (False, False),
        (False, True),
    ]
    claim = identity_claim(steps)
    assert claim["holds"] is True and claim["violations"] == []
    assert (claim["weights_equal_steps"], claim["responses_equal_at_equal_weights"]) == (2, 2)
    assert claim["weights_first_differ_step"] == 3 and claim["responses_equal_steps"] == 3


def test_different_responses_from_bitwise_equal_weights_are_a_violation():
    steps = step_identity(BASE_ROWS, _rows(["w1", "w2", "w3", "x4"]), BASE_RESPONSES, _responses(["a", "B", "c", "d"]))
    claim = identity_claim(steps)
    assert claim["violations"] == [2] and claim["holds"] is False
    assert (claim["weights_equal_steps"], claim["responses_equal_at_equal_weights"]) == (3, 2)
    assert claim["weights_first_differ_step"] == 4


def test_missing_checksums_or_dumps_make_a_step_unknown_not_equal():
    rows = _rows(["w1", None, "w3", "w4"])
    responses = {1: [("p", "a")], 3: [], 4: [("p", "d")]}  # step 2 has no dump, step 3 an empty one
    steps = step_identity(BASE_ROWS, rows, BASE_RESPONSES, responses)
    assert [s["weights_equal"] for s in steps] == [True, None, True, True]
    assert [s["responses_equal"] for s in steps] == [True, None, None, True]
    claim = identity_claim(steps)
    assert claim["weights_unknown_steps"] == [2] and claim["violations"] == []
    assert claim["holds"] is False  # step 3 had equal weights but nothing to compare: not shown to hold
    assert identity_claim(step_identity(BASE_ROWS, _rows([None] * 4), BASE_RESPONSES, BASE_RESPONSES))["holds"] is None


def test_identity_by_run_covers_every_run_but_the_baseline_and_needs_a_baseline():
    runs = {"baseline": BASE_ROWS, "tlt": _rows(["w1", "w2", "w3", "w4"]), "baseline_repeat": _rows(["w1"] * 4)}
    responses = {"baseline": BASE_RESPONSES, "tlt": BASE_RESPONSES, "baseline_repeat": BASE_RESPONSES}
    identity = identity_by_run(runs, responses)
    assert sorted(identity) == ["baseline_repeat", "tlt"]
    assert identity["tlt"]["holds"] is True and identity["tlt"]["weights_first_differ_step"] is None
    assert identity["baseline_repeat"]["weights_first_differ_step"] == 2
    assert identity_by_run({"tlt": runs["tlt"]}, responses) == {}
