"""Make verl-tlt's config group ``tlt`` visible to every Hydra app, including verl's stock entry point.

With it, ``python -m verl.trainer.main_ppo ... +tlt=on`` composes ``verl_tlt/hydra_conf/tlt/on.yaml``
into verl's own ``ppo_trainer`` config, with no wrapper script. Hydra imports this module while it builds
the config search path, so it imports only Hydra.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

# Provider name Hydra shows in `--info searchpath`; the path is the package holding the `tlt` group.
PROVIDER = "verl-tlt"
SEARCH_PATH = "pkg://verl_tlt.hydra_conf"


class VerlTLTSearchPathPlugin(SearchPathPlugin):
    """Append ``pkg://verl_tlt.hydra_conf`` to the search path, after the app's own config dirs."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        # Appended, not prepended: the app's (verl's) configs keep precedence for any shared name.
        search_path.append(provider=PROVIDER, path=SEARCH_PATH)
