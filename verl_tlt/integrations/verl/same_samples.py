"""The verl overrides that make runs of one config comparable sample for sample, and step for step.

Two things vary between runs of the same config, and both are fixed here:
- what is sampled: verl's requests carry no seed, so the slot-seeded agent loop (`slot_seeded_agent_loop`) seeds
  each from its slot; the torch rollout's keyed sampling then draws the same tokens for a slot in every run, and
  speculative decoding changes none of them;
- how it is trained on: verl's replay buffer hands the trainer a batch in the order its samples finished, which
  follows timing, so the floating-point order of the update, and in time the weights, differ between runs; the
  slot-ordered sampler (`slot_ordered_sampler`) hands the same batch in slot order instead.

With both, a run with TLT on and one with TLT off train to bitwise-equal weights and sample identical responses at
every step. Neither changes what is learned: the samples' distribution and the batch's contents are verl's own.
This module only names the settings (no verl import), so that a launcher can use them without importing verl.
"""

from __future__ import annotations

from verl_tlt.request_seeds import SLOT_AGENT_LOOP

SAMPLER_PATH = "pkg://verl_tlt.integrations.verl.slot_ordered_sampler"
SAMPLER_NAME = "SlotOrderedReplayBuffer"

SAME_SAMPLES_OVERRIDES: tuple[str, ...] = (
    f"actor_rollout_ref.rollout.agent.default_agent_loop={SLOT_AGENT_LOOP}",
    f"trainer.v1.sampler.custom_sampler.path={SAMPLER_PATH}",
    f"trainer.v1.sampler.custom_sampler.name={SAMPLER_NAME}",
)
