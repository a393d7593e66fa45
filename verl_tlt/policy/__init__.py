"""The speculation decision: when a rollout step may speculate and with which strategy.

One floor for every backend: the gate (threshold, batch-size buckets, the plain arm), the ``Policy`` protocol, TLT's
adaptive bandit, the fixed-strategy baseline, and the decode counters all of them report. Pure Python over the
strategy dataclasses of ``verl_tlt.spec.strategy``: no torch, no engine, no framework, so the simulator and vLLM's
engine-core process use the same code as the torch engine.
"""

from verl_tlt.policy.adaptive import AdaptivePolicy
from verl_tlt.policy.decode_stats import DecodeStats
from verl_tlt.policy.fixed import FixedBelowThreshold
from verl_tlt.policy.gate import DEFAULT_BUCKETS, PLAIN, SpeculationGate
from verl_tlt.policy.protocol import Policy, PolicySettings

__all__ = [
    "DEFAULT_BUCKETS",
    "PLAIN",
    "AdaptivePolicy",
    "DecodeStats",
    "FixedBelowThreshold",
    "Policy",
    "PolicySettings",
    "SpeculationGate",
]
