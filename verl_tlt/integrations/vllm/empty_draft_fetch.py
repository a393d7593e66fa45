"""The engine core's half of a K=0 step without cost: no round trip to the workers for drafts a step never made.

After each step of a speculating engine with synchronous scheduling (the only kind vLLM's CPU build runs), vLLM's
engine core asks its workers for the step's draft token ids (``EngineCore.post_step`` -> ``take_draft_token_ids``,
one RPC). After a step whose K was 0 the answer is known without asking: no drafts, and the scheduler already
cleared every scheduled request's drafts when it scheduled the step, which is all that an empty answer would do.
On vLLM's CPU build that round trip was about a tenth of a plain step (docs/benchmarks.md, "what a K=0 step still
costs"). With ``ENV`` set to 1 (``engine_setup`` sets it where TLT defers the drafter's first pass), ``register``
wraps, in every vLLM process (it only acts where an engine core runs):

- ``Scheduler.schedule``: notes whether the step it scheduled drafts (``num_spec_tokens_to_schedule > 0``);
- ``EngineCore.post_step``: skips the fetch after a step that drafted nothing.

Async scheduling (drafts stay in the workers) and pipeline-parallel batch queues (scheduled ahead of what ran) keep
vLLM's own behaviour. A ``vllm.general_plugins`` entry: vLLM calls ``register`` in each process it starts.
"""

from __future__ import annotations

import logging
import os
from typing import Any

ENV = "VERL_TLT_VLLM_SKIP_EMPTY_DRAFT_FETCH"
_DRAFTS_SCHEDULED = "_verl_tlt_drafts_scheduled"  # set on the scheduler by the wrapped schedule
_SKIPPED = "_verl_tlt_skipped_draft_fetches"  # counted on the engine core

logger = logging.getLogger(__name__)


def register() -> None:
    if os.environ.get(ENV) != "1":
        return
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.engine.core import EngineCore
    except ImportError as error:  # a vLLM without these: its own behaviour, said once per process
        logger.warning("verl-tlt: cannot skip empty draft fetches on this vLLM (%s); every step fetches", error)
        return
    install(Scheduler, EngineCore)


def install(scheduler_cls: type, engine_core_cls: type) -> None:
    """Wrap `scheduler_cls.schedule` and `engine_core_cls.post_step` (once; the classes keep working as before for
    anything else)."""
    if getattr(engine_core_cls.post_step, "_verl_tlt_wrapped", False):
        return
    schedule, post_step = scheduler_cls.schedule, engine_core_cls.post_step

    def schedule_noting_drafts(self, *args: Any, **kwargs: Any):
        output = schedule(self, *args, **kwargs)
        setattr(self, _DRAFTS_SCHEDULED, getattr(output, "num_spec_tokens_to_schedule", 1) > 0)
        return output

    def post_step_without_empty_fetch(self, model_executed: bool) -> None:
        drafted = getattr(self.scheduler, _DRAFTS_SCHEDULED, True)
        speculative = getattr(self, "use_spec_decode", False)  # not a diffusion model's drafts
        if model_executed and speculative and not drafted and getattr(self, "batch_queue", None) is None:
            setattr(self, _SKIPPED, getattr(self, _SKIPPED, 0) + 1)
            return
        post_step(self, model_executed)

    schedule_noting_drafts._verl_tlt_wrapped = True
    post_step_without_empty_fetch._verl_tlt_wrapped = True
    scheduler_cls.schedule = schedule_noting_drafts
    engine_core_cls.post_step = post_step_without_empty_fetch
    logger.info("verl-tlt: the engine core skips fetching drafts after steps that drafted none (%s=1)", ENV)


def skipped_fetches(engine_core: Any) -> int:
    """How many draft fetches `engine_core` skipped."""
    return getattr(engine_core, _SKIPPED, 0)
