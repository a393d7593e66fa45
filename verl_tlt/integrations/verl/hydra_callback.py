"""The Hydra callback that ``tlt/on.yaml`` and ``tlt/off.yaml`` add: verl's stock entry point checks TLT's needs.

``python -m verl.trainer.main_ppo`` runs no verl-tlt code before its trainer starts inside Ray, so a request for
TLT that cannot be served (``+tlt=off tlt.enabled=true`` keeps verl's own trainer) would otherwise run stock verl
without a word. Hydra calls ``on_job_start`` with the composed config before the task function, so before Ray.
"""

from __future__ import annotations

import logging
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from verl_tlt.integrations.verl.requirements import TLTNotAvailableError, check_requirements

logger = logging.getLogger(__name__)


class TLTRequirementsCallback(Callback):
    """Stop the job before it starts when ``tlt.enabled=true`` would not run TLT (see ``requirements``)."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            tlt_cfg = check_requirements(config)
        except (ValueError, TLTNotAvailableError) as error:
            # Hydra turns an exception raised by a callback into a warning and runs the job anyway; SystemExit is
            # not an Exception, so it ends the process here, printing the message.
            raise SystemExit(f"verl-tlt: {type(error).__name__}: {error}") from error
        logger.debug("verl-tlt: start-up checks passed (tlt.enabled=%s)", tlt_cfg.enabled)
