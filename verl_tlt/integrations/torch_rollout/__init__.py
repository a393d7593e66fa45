"""The torch engine as a verl rollout (``actor_rollout_ref.rollout.name=torch``): the server actor that runs a
RolloutEngine, the replica that launches it, the adapter verl's workers use for weight sync, and its options
(``engine_kwargs.torch``). A peer of ``integrations.vllm``; the verl glue above drives both.
"""
