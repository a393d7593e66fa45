"""The quickstart's identity claim, per run and step against the baseline: were the rollout weights bitwise equal
(the replicas' weight checksums in the rollout traces), and were the sampled responses equal (verl's rollout
dumps)? Pure functions.

Every run seeds each sample from its slot and the torch engine's keyed sampling makes speculative decoding emit
plain decoding's tokens, so from bitwise-equal weights every run must sample exactly the baseline's responses. A
step with equal weights and different responses is a violation: in a TLT run, of lossless speculative decoding; in
the control (TLT off), of the rollout's determinism. Once weights differ (training on CPU need not be bitwise
reproducible run to run), responses may differ and nothing is claimed; the control shows whether they differ
without TLT too.
"""

from __future__ import annotations

from typing import Any


def responses_by_step(rollouts: dict[int, list[dict]]) -> dict[int, list[tuple[str, str]]]:
    """step -> the step's (prompt, response) pairs in a canonical order, from verl's rollout dumps of that step."""
    return {step: sorted((r["input"], r["output"]) for r in dump) for step, dump in rollouts.items()}


def same_responses_steps(responses: dict[str, dict[int, list]]) -> dict[str, str]:
    """Per run: in how many steps it sampled exactly the baseline's responses ("k/n")."""
    baseline = responses.get("baseline", {})
    return {
        name: f"{sum(by_step.get(step) == dump for step, dump in baseline.items())}/{len(baseline)}"
        for name, by_step in responses.items()
        if name != "baseline"
    }


def step_identity(
    baseline_rows: list[dict],
    rows: list[dict],
    baseline_responses: dict[int, list],
    responses: dict[int, list],
) -> list[dict[str, Any]]:
    """Per step of a run: weights_equal and responses_equal against the baseline, each True, False or None (not
    known: a checksum or a rollout dump is missing)."""
    baseline_weights = {r["step"]: r.get("weights_sha256") for r in baseline_rows}
    steps = []
    for row in rows:
        step = row["step"]
        ours, theirs = row.get("weights_sha256"), baseline_weights.get(step)
        mine, base = responses.get(step), baseline_responses.get(step)
        steps.append(
            {
                "step": step,
                "weights_equal": None if ours is None or theirs is None else ours == theirs,
                "responses_equal": None if not mine or not base else mine == base,
            }
        )
    return steps


def identity_claim(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run's `step_identity` supports: how many steps had the baseline's weights, whether every one of them
    sampled the baseline's responses (`holds`; None when no step's weights are known equal), where weights first
    differed, and the violations (equal weights, different responses)."""
    equal_weights = [s for s in steps if s["weights_equal"] is True]
    violations = [s["step"] for s in equal_weights if s["responses_equal"] is False]
    identical = sum(s["responses_equal"] is True for s in equal_weights)
    return {
        "num_steps": len(steps),
        "weights_equal_steps": len(equal_weights),
        "responses_equal_at_equal_weights": identical,
        "weights_first_differ_step": next((s["step"] for s in steps if s["weights_equal"] is False), None),
        "weights_unknown_steps": [s["step"] for s in steps if s["weights_equal"] is None],
        "responses_equal_steps": sum(s["responses_equal"] is True for s in steps),
        "violations": violations,
        "holds": None if not equal_weights else identical == len(equal_weights),
        "steps": steps,
    }


def identity_by_run(
    runs: dict[str, list[dict]], responses: dict[str, dict[int, list]], baseline: str = "baseline"
) -> dict[str, dict[str, Any]]:
    """`identity_claim` of every run but the baseline (empty without a baseline run)."""
    if baseline not in runs:
        return {}
    return {
        name: identity_claim(step_identity(runs[baseline], rows, responses.get(baseline, {}), responses.get(name, {})))
        for name, rows in runs.items()
        if name != baseline
    }
