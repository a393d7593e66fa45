"""Fitting a scenario to rollout records: the fits recover the numbers that made the records."""

from __future__ import annotations

import pytest

from verl_tlt.sim.acceptance import expected_committed
from verl_tlt.sim.fit import fit_drafter, fit_plain, mean_batch


def plain_costs(fixed, per_token, groups=((1, 1.0), (4, 5.0), (16, 20.0))):
    """{group: {'plain': [tokens, seconds, steps]}} for 10 steps per group at the given mean batch."""
    return {g: {"plain": [10 * b, 10 * (fixed + per_token * b), 10]} for g, b in groups}


def test_the_plain_fit_recovers_a_linear_cost():
    fit = fit_plain(plain_costs(0.003, 0.0002))
    assert fit.fixed_s == pytest.approx(0.003) and fit.per_token_s == pytest.approx(0.0002)


def test_the_drafter_fit_recovers_its_fraction_and_acceptance():
    fixed, per_token, fraction, alpha = 0.003, 0.0002, 0.1, 0.6
    costs = plain_costs(fixed, per_token)
    for group, arms in costs.items():
        batch = mean_batch(group, arms)
        plain = fixed + per_token * batch
        for name, depth in (("4_1_4", 4), ("2_1_2", 2)):
            seconds = depth * fraction * plain + plain + per_token * batch * depth
            arms[name] = [5 * batch * expected_committed(alpha, depth), 5 * seconds, 5]
    fitted_fraction, fitted_alpha, per_arm = fit_drafter(costs, fit_plain(costs))
    assert fitted_fraction == pytest.approx(fraction, rel=1e-6) and fitted_alpha == pytest.approx(alpha, rel=1e-6)
    assert per_arm["4_1_4"] == pytest.approx(expected_committed(alpha, 4))


def test_records_without_the_needed_steps_say_which_run_to_give():
    with pytest.raises(ValueError, match="baseline"):
        fit_plain({1: {"4_1_4": [1, 1.0, 1]}})
    with pytest.raises(ValueError, match="frozen-drafter"):
        fit_drafter(plain_costs(0.003, 0.0002), fit_plain(plain_costs(0.003, 0.0002)))
