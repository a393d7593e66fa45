"""``python -m verl_tlt.main_ppo <stock verl args> tlt.enabled=true``: verl's PPO entry point plus a tlt block.

The primary config (``hydra_conf/tlt_ppo_trainer.yaml``) is verl's ``ppo_trainer`` with a ``tlt:`` block,
so ``tlt.*`` keys need no ``+``. This module validates that block before verl's ``main`` runs (so before
Ray starts), then hands the config to verl's own ``main`` unchanged: with ``tlt.enabled=false`` the run is
exactly a stock ``python -m verl.trainer.main_ppo`` run.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from verl_tlt.config import ROOT_KEY, TLTConfig, check_available

logger = logging.getLogger(__name__)

# The V1 trainer mode registered by verl_tlt.integrations.verl.trainer_mode (kept as a literal here so
# that this module does not import the integration layer, which imports verl).
TLT_TRAINER_MODE = "tlt_sync"


def validate_tlt(config: DictConfig) -> TLTConfig:
    """Parse the composed config's ``tlt`` block; raises ``ValueError``/``TLTNotAvailableError`` on bad input."""
    tlt_cfg = TLTConfig.from_dict(config.get(ROOT_KEY), prefix=ROOT_KEY)
    check_available(tlt_cfg, config)
    return tlt_cfg


def select_trainer_mode(config: DictConfig, tlt_cfg: TLTConfig) -> None:
    """With TLT on, run verl's sync trainer as the TLT trainer mode (what ``+tlt=on`` sets in the stock entry).

    The wrapper's defaults keep ``trainer.v1.trainer_mode=sync`` so that TLT off runs verl's own trainer
    class; the switch happens here, once, at start-up. Other trainer modes have no TLT variant yet.
    """
    if not tlt_cfg.enabled:
        return
    if not config.trainer.use_v1:
        raise ValueError(
            f"{ROOT_KEY}.enabled=true needs verl's V1 trainer, got trainer.use_v1=false (the legacy trainer "
            f"has no TLT mode). Fix: set trainer.use_v1=true, or {ROOT_KEY}.enabled=false."
        )
    mode = config.trainer.v1.trainer_mode
    if mode == "sync":
        config.trainer.v1.trainer_mode = TLT_TRAINER_MODE
    elif mode != TLT_TRAINER_MODE:
        raise ValueError(
            f"{ROOT_KEY}.enabled=true supports only the sync trainer, got trainer.v1.trainer_mode={mode}. "
            f"Fix: set trainer.v1.trainer_mode=sync (run as {TLT_TRAINER_MODE}), or {ROOT_KEY}.enabled=false."
        )


def run_verl(config: DictConfig) -> None:
    """Run exactly what ``python -m verl.trainer.main_ppo`` runs, on an already composed config.

    verl's ``main`` is wrapped by ``@hydra.main``; Hydra's wrapper skips argument parsing and composition
    and calls the undecorated body when it is passed a config (``cfg_passthrough``), so no verl code is
    copied here. Imported lazily so that importing this module stays cheap (composing the config still
    imports the ``verl`` package: Hydra's ``pkg://verl.trainer.config`` search path imports it).
    """
    from verl.trainer.main_ppo import main as verl_main

    verl_main(config)


@hydra.main(config_path="hydra_conf", config_name="tlt_ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """Validate the tlt block, then run verl's PPO trainer."""
    tlt_cfg = validate_tlt(config)
    select_trainer_mode(config, tlt_cfg)
    logger.info("verl-tlt: %s.enabled=%s; running verl's PPO trainer", ROOT_KEY, str(tlt_cfg.enabled).lower())
    run_verl(config)


if __name__ == "__main__":
    main()
