"""What a torch rollout replica tells its speculation policy when a drafter is loaded or re-tested: the replica's
timed step costs (once, at the first drafter) and the drafter's probed acceptance (policy.cost_model)."""

from __future__ import annotations

import logging
import os
import time

from verl_tlt.engine import RolloutEngine
from verl_tlt.engine.step_costs import measure_step_costs, timed_batch_sizes
from verl_tlt.policy.adaptive import AdaptivePolicy
from verl_tlt.policy.cost_model import CostModel

logger = logging.getLogger(__name__)
# Like verl's own modules: INFO unless VERL_LOGGING_LEVEL says otherwise (the timing's progress lines).
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))


def refresh_policy_costs(engine: RolloutEngine, probe_alpha: float | None, replica_rank: int, version) -> None:
    """Call with the engine idle (the server's lock held), after a drafter load or a passing wake-up test: the
    policy's acceptance from the self-test's probe (`probe_alpha`, None when not probed), and, the first time, the
    replica's step costs. A drafter the model says cannot pay is logged with the numbers; the replica then decodes
    plainly but for the bandit's probes. A failed timing is logged and leaves the policy playing every arm first."""
    policy = engine.policy
    if not isinstance(policy, AdaptivePolicy) or engine.drafter is None:
        return
    if policy.costs is None:
        begin = time.perf_counter()
        try:
            table = measure_step_costs(
                engine,
                timed_batch_sizes(policy.threshold, engine.max_num_seqs),
                list(policy.strategies.values()),
                report=lambda line: logger.info("torch rollout server %d step costs, %s", replica_rank, line),
            )
        except (RuntimeError, ValueError) as error:
            logger.warning(
                "torch rollout server %d: step costs not measured (%s); the policy learns them by playing",
                replica_rank,
                error,
            )
            return
        policy.attach_costs(CostModel(table, policy.strategies))
        logger.info(
            "torch rollout server %d timed its decode steps in %.1f s", replica_rank, time.perf_counter() - begin
        )
    policy.new_drafter(probe_alpha)
    reason = policy.cannot_pay()
    if reason is not None:
        logger.warning(
            "torch rollout server %d: drafter version %s cannot pay: %s; decoding plainly (probes aside) until a "
            "drafter that pays is loaded",
            replica_rank,
            version,
            reason,
        )
