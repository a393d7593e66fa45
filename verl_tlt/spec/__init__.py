"""Pure speculative-decoding math (torch only): logits processing, draft trees, lossless verification.

Nothing in this package imports verl, ray or vLLM.
"""

from verl_tlt.spec.logits import GREEDY_EPS, LogitsParams, is_greedy, process_logits, token_log_probs
from verl_tlt.spec.strategy import SpecStrategy
from verl_tlt.spec.tree import DraftTree, build_chain, build_eagle2_tree, chain_from_expand, tree_attention_mask
from verl_tlt.spec.verify import VerifyResult, emitted_positions, verify_tree

__all__ = [
    "GREEDY_EPS",
    "DraftTree",
    "LogitsParams",
    "SpecStrategy",
    "VerifyResult",
    "build_chain",
    "build_eagle2_tree",
    "chain_from_expand",
    "emitted_positions",
    "is_greedy",
    "process_logits",
    "token_log_probs",
    "tree_attention_mask",
    "verify_tree",
]
