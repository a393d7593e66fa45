"""The EAGLE drafter: model (and, as they land, its data buffer, trainer and export). No verl/ray/vLLM imports."""

from verl_tlt.drafter.export import export_eagle, load_eagle
from verl_tlt.drafter.model import EagleDrafterModel

__all__ = ["EagleDrafterModel", "export_eagle", "load_eagle"]
