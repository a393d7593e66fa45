"""Hydra SearchPathPlugin of verl-tlt (discovered by Hydra's scan of the ``hydra_plugins`` namespace).

This sub-package needs this ``__init__.py`` (Hydra did not find the plugin without it); the
``hydra_plugins`` directory itself must not have one, so other distributions can share the namespace.
"""
