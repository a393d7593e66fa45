"""The EAGLE drafter: model (and, as they land, its data buffer, trainer and export). No verl/ray/vLLM imports."""

from verl_tlt.drafter.model import EagleDrafterModel

__all__ = ["EagleDrafterModel"]
