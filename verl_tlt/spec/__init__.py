"""Pure speculative-decoding math (torch only): logits processing, draft trees, lossless verification.

Nothing in this package imports verl, ray or vLLM.
"""

from verl_tlt.spec.logits import GREEDY_EPS, is_greedy, process_logits

__all__ = ["GREEDY_EPS", "is_greedy", "process_logits"]
