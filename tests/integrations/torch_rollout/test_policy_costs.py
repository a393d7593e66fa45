"""What a torch replica tells its policy at a drafter load: timed costs once, the probe's acceptance each time, a
timing that cannot run left out with a warning."""

from __future__ import annotations

import logging

from tests.engine.conftest import tiny_qwen2  # noqa: F401
from tests.engine.drafters import HFModelDrafter
from verl_tlt.config import SpeculativeConfig
from verl_tlt.engine import RolloutEngine
from verl_tlt.integrations.torch_rollout.policy_costs import refresh_policy_costs
from verl_tlt.policy import AdaptivePolicy

CONFIG = SpeculativeConfig(threshold=4, buckets=(1, 2, 4), strategies=("4_1_4", "2_1_2"))


def test_costs_are_timed_once_and_the_probe_is_taken_each_time(tiny_qwen2):  # noqa: F811
    path, hf_model = tiny_qwen2
    policy = AdaptivePolicy(CONFIG)
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=4, drafter=HFModelDrafter(hf_model), policy=policy)
    refresh_policy_costs(engine, 0.9, replica_rank=0, version=0)
    table = policy.costs.table
    assert set(table.seconds) == {"plain", "4_1_4", "2_1_2"} and policy.costs.alpha == 0.9
    refresh_policy_costs(engine, 0.2, replica_rank=0, version=1)
    assert policy.costs.table is table and policy.costs.alpha == 0.2  # not timed again; the new drafter's probe


def test_an_engine_too_short_to_time_leaves_the_policy_without_costs(tiny_qwen2, caplog):  # noqa: F811
    path, hf_model = tiny_qwen2
    policy = AdaptivePolicy(CONFIG)
    engine = RolloutEngine.from_pretrained(
        str(path), max_num_seqs=4, max_model_len=24, drafter=HFModelDrafter(hf_model), policy=policy
    )
    with caplog.at_level(logging.WARNING):
        refresh_policy_costs(engine, 0.9, replica_rank=3, version=0)
    assert policy.costs is None and "torch rollout server 3: step costs not measured" in caplog.text


def test_nothing_happens_without_a_drafter_or_an_adaptive_policy(tiny_qwen2):  # noqa: F811
    policy = AdaptivePolicy(CONFIG)
    engine = RolloutEngine.from_pretrained(str(tiny_qwen2[0]), max_num_seqs=4, policy=policy)
    refresh_policy_costs(engine, 0.9, replica_rank=0, version=0)
    assert policy.costs is None


def test_a_drafter_that_cannot_pay_is_logged_with_its_numbers(tiny_qwen2, monkeypatch, caplog):  # noqa: F811
    """Recorded step costs (not this host's timing): with a probe that agreed nowhere, no strategy can pay, and the
    replica says so, with the acceptance and the best arm's predicted share of plain."""
    import verl_tlt.integrations.torch_rollout.policy_costs as policy_costs
    from verl_tlt.policy.cost_model import StepCostTable

    recorded = StepCostTable({"plain": {1: 0.05, 4: 0.06}, "4_1_4": {1: 0.15, 4: 0.2}, "2_1_2": {1: 0.1, 4: 0.13}})
    monkeypatch.setattr(policy_costs, "measure_step_costs", lambda *args, **kwargs: recorded)
    path, hf_model = tiny_qwen2
    policy = AdaptivePolicy(CONFIG)
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=4, drafter=HFModelDrafter(hf_model), policy=policy)
    with caplog.at_level(logging.WARNING):
        refresh_policy_costs(engine, 0.0, replica_rank=1, version=7)
    assert "torch rollout server 1: drafter version 7 cannot pay: with acceptance alpha=0.00" in caplog.text
    assert "2_1_2 at batch 1, is predicted at 0.50x plain's rate" in caplog.text
    assert engine.policy.select(1) is None  # plain from the first step
