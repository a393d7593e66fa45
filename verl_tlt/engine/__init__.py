"""The torch rollout engine: batched KV-cached decoding with continuous batching (no verl/ray/vLLM imports)."""

from verl_tlt.engine.drafts.group import GroupDrafts
from verl_tlt.engine.engine import RolloutEngine
from verl_tlt.engine.request import CompletionOutput
from verl_tlt.engine.sampling_params import SamplingParams

__all__ = ["CompletionOutput", "GroupDrafts", "RolloutEngine", "SamplingParams"]
