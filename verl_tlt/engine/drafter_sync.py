"""Loading a drafter's newest weights into a running engine (what each rollout replica does after a weight sync).

Weights are versioned: the same version twice is a no-op, so the trainer can push after every step without
knowing whether the drafter changed. Each load builds the EAGLE drafter on the engine's target (sharing its embedding
and LM head, so target weight syncs reach the drafter too); the policy that uses it is the engine's own. With a
self-test (engine.drafts.self_test), a new drafter that scores far below the last passing one is refused: the
engine keeps the drafter it had.
"""

from __future__ import annotations

import logging

import torch

from verl_tlt.drafter.family import DrafterModel, drafter_for_state
from verl_tlt.engine.drafts.eagle import EagleDrafter
from verl_tlt.engine.drafts.self_test import DrafterSelfTest
from verl_tlt.engine.engine import RolloutEngine

logger = logging.getLogger(__name__)


class DrafterSync:
    def __init__(self, engine: RolloutEngine, self_test: DrafterSelfTest | None = None):
        self.engine, self.self_test = engine, self_test
        self.model: DrafterModel | None = None
        self.version: int | None = None

    def update(self, state: dict[str, torch.Tensor], version: int) -> bool:
        """Load `state` (a drafter state dict of either family) as drafter `version`; False if already loaded, or
        refused by the self-test (logged; the engine keeps its previous drafter).

        Call between rollouts: the engine refuses a drafter change while requests are in flight.
        """
        if version == self.version:
            return False
        if self.engine.has_unfinished():
            raise RuntimeError(f"Cannot load drafter version {version} while requests are in flight")
        # A fresh model each time: a strict load that fails has already copied every tensor that fit, and the
        # drafter the engine runs must stay the last good version.
        try:
            model = drafter_for_state(state, self.engine.model)  # either family: the state says which
        except (RuntimeError, ValueError) as error:
            raise ValueError(f"Drafter version {version} does not fit this target's drafter: {error}") from error
        model.to(device=self.engine.device, dtype=self.engine.dtype)
        previous = self.engine.drafter
        # A fresh runtime drops the drafter's KV state (stale for new weights) and clears a previous failure.
        self.engine.set_drafter(EagleDrafter(model, max_len=self.engine.cache.max_len))
        verdict = self.self_test.check(self.engine) if self.self_test is not None else None
        if verdict is not None and not verdict.passed:
            self.engine.set_drafter(previous)
            logger.warning(
                "Drafter version %d refused by the self-test: %s; keeping %s",
                version,
                verdict.reason,
                "no drafter (plain decoding)" if previous is None else f"version {self.version}",
            )
            return False
        self.model, self.version = model, version
        return True

    def drop(self) -> None:
        """Detach the drafter (speculation off) until the next version is loaded."""
        self.engine.set_drafter(None)
        self.model = self.version = None
