"""Which verl trainer mode a run uses: the TLT trainer's name, verl's sync mode, and the wrapper's choice between them.

Kept apart from `trainer_mode` (the trainer class, which the start-up checks in `requirements` must not import) so
that both the checks and the trainer read the names from here.
"""

from __future__ import annotations

from typing import Any

# The trainer.v1.trainer_mode that selects the TLT trainer (tlt/on.yaml spells it out; a test holds both equal).
TLT_TRAINER_MODE = "tlt_sync"

# verl's sync trainer mode. verl's PPOTrainer branches on the literal string `self.trainer_mode == "sync"` (replay
# buffer class, dataloader refill, TransferQueue checkpointing, prompt submission; trainer_base.py:153,731,902,912,
# 1004,1499 in 0.9.1): there is no seam to declare a new mode synchronous, so the TLT trainer reports this one.
VERL_SYNC_MODE = "sync"


def select_trainer_mode(config: Any, tlt_enabled: bool) -> None:
    """``verl_tlt.main_ppo``'s choice: with TLT on, verl's sync trainer runs as ``tlt_sync``.

    The wrapper's defaults keep ``trainer.v1.trainer_mode=sync`` so that TLT off runs verl's own trainer class;
    any other mode is left alone, for ``requirements.check_requirements`` to accept or refuse with its fix.
    """
    if tlt_enabled and config.trainer.v1.trainer_mode == VERL_SYNC_MODE:
        config.trainer.v1.trainer_mode = TLT_TRAINER_MODE
