"""``python -m verl_tlt.main_ppo <stock verl args> tlt.enabled=true``: verl's PPO entry point plus a tlt block.

The primary config (``hydra_conf/tlt_ppo_trainer.yaml``) is verl's ``ppo_trainer`` with a ``tlt:`` block,
so ``tlt.*`` keys need no ``+``. With TLT on, this module selects the TLT trainer mode and checks that the run
can give TLT, both before verl's ``main`` runs (so before Ray starts), then hands the config to verl's own
``main``: with ``tlt.enabled=false`` the run is exactly a stock ``python -m verl.trainer.main_ppo`` run.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from verl_tlt.config import ROOT_KEY
from verl_tlt.integrations.verl.mode_selection import select_trainer_mode
from verl_tlt.integrations.verl.requirements import check_requirements, tlt_config_of

logger = logging.getLogger(__name__)


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
    """Select the trainer mode, check the run can give what the tlt block asks for, then run verl's PPO trainer."""
    select_trainer_mode(config, tlt_config_of(config).enabled)
    tlt_cfg = check_requirements(config)
    logger.info("verl-tlt: %s.enabled=%s; running verl's PPO trainer", ROOT_KEY, str(tlt_cfg.enabled).lower())
    run_verl(config)


if __name__ == "__main__":
    main()
