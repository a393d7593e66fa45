"""The EAGLE drafter: model, data buffer, trainer, checkpoints, export and loading. No verl/ray/vLLM imports."""

from verl_tlt.drafter.export import export_eagle
from verl_tlt.drafter.load import load_eagle
from verl_tlt.drafter.model import EagleDrafterModel

__all__ = ["EagleDrafterModel", "export_eagle", "load_eagle"]
