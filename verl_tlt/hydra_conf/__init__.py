"""Hydra configs shipped by verl-tlt (``pkg://verl_tlt.hydra_conf``).

A regular package, so that Hydra's ``pkg://`` source finds it the same way in editable and wheel installs.
"""
