"""Pure speculative-decoding math (torch only): logits processing, draft trees, lossless verification.

Nothing in this package imports verl, ray or vLLM. Names are loaded lazily, so that `verl_tlt.spec.strategy`
(plain dataclasses, which the config validates strategies with) can be imported without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULE_OF = {
    "GREEDY_EPS": "logits",
    "LogitsParams": "logits",
    "is_greedy": "logits",
    "process_logits": "logits",
    "token_log_probs": "logits",
    "SpecStrategy": "strategy",
    "DraftTree": "tree",
    "build_chain": "tree",
    "build_eagle2_tree": "tree",
    "chain_from_expand": "tree",
    "tree_attention_mask": "tree",
    "VerifyResult": "verify",
    "emitted_positions": "verify",
    "verify_keyed": "verify",
    "verify_tree": "verify",
    "gumbel_noise": "keyed_noise",
    "request_key": "keyed_noise",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
