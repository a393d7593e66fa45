"""verl's actor worker plus TLT's hidden-state capture (see `hidden_capture`).

The TLT trainer puts this class where verl's V1 trainer hard-codes `ActorRolloutRefWorker`
(`PPOTrainer._init_resource_pool_mgr`). It adds three Ray-dispatched methods and changes nothing else: until
`tlt_install_capture` is called, and whenever capture is not armed, it is verl's worker.
"""

from __future__ import annotations

from typing import Any

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker

from verl_tlt.drafter.capture import CaptureWindows
from verl_tlt.integrations.verl.hidden_capture import HiddenStateCapture


class TLTActorRolloutRefWorker(ActorRolloutRefWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def tlt_install_capture(self) -> bool:
        """Hook the actor's engine (once); False on a worker without an actor (e.g. a standalone ref)."""
        if getattr(self, "_tlt_capture", None) is not None:
            return True
        actor = getattr(self, "actor", None)
        if actor is None:
            return False
        engine = actor.engine
        # Sequence-parallel peers gather each sequence's slices together; one of them (verl's output rank) keeps it.
        sp_group = getattr(engine, "ulysses_parallel_group", None) if getattr(engine, "use_ulysses_sp", False) else None
        self._tlt_capture = HiddenStateCapture(
            engine,
            dp_size=engine.get_data_parallel_size(),
            sp_group=sp_group,
            keeps=bool(engine.is_mp_src_rank_with_outputs()),
        )
        actor.infer_batch = self._tlt_capture.wrap(actor.infer_batch)
        actor.train_mini_batch = self._tlt_capture.wrap(actor.train_mini_batch)
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def tlt_arm_capture(
        self,
        step: int,
        token_budget: int,
        teacher_top_k: int = 0,
        windows: CaptureWindows | None = None,
        feature_layers: tuple[int, ...] = (),
    ) -> None:
        capture = getattr(self, "_tlt_capture", None)
        if capture is not None:
            capture.arm(step, token_budget, teacher_top_k, windows, feature_layers)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def tlt_pop_captured(self) -> tuple[list[Any], dict[str, float]]:
        """This rank's captured samples since the last call, and the capture's cost."""
        capture = getattr(self, "_tlt_capture", None)
        if capture is None:
            return [], {}
        return capture.pop()
