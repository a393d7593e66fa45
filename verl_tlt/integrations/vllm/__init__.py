"""TLT on verl's vLLM rollout (``actor_rollout_ref.rollout.name=vllm``): server/replica subclasses, the worker
extension that loads drafters in place, the spec-decode stat logger, and the speculative config built from
``tlt.speculative``. vLLM is imported lazily by the modules that need it, never by this package's init.
"""
