"""The target's forward under torch.compile, one compiled function per kind of engine step (opt-in).

Why: on a small model every decode step is dominated by per-op overhead (Python, dispatch, a dozen elementwise
kernels per layer). Inductor fuses the elementwise work and runs the step as a few generated kernels plus the
matrix products, which makes plain decoding of a small model markedly faster (`verl-tlt bench engine`). The
price is a compile on first use of each kind of step (seconds to tens of seconds on a small CPU) and whatever
shapes trigger a recompile.

Why one compiled function per kind of step and per engine: dynamo keeps its graphs on the code object it compiled,
with a recompile budget per code object (`torch._dynamo.config.recompile_limit`, 8), and falls back to eager with
only a warning once it is spent. Prefill (kv_len == T), plain decode (T == 1) and verification (T == draft nodes
+ 1, kv_len > T) need different graphs, each at batch 1 and at batch > 1 (dynamo specialises sizes 0 and 1) and
with the KV length below or at the cache's capacity. Each engine's step kinds therefore get code objects of their
own; one shared code object ran out of budget when a process built four compiled engines (`bench engine`). Shapes
are dynamic (`dynamic=True`): the growing KV length does not recompile.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable

import torch

from verl_tlt.modeling.cpu_linear import register_for_compile

STEP_KINDS = ("prefill", "decode", "verify")
_instances = itertools.count()


def _step_forward(model, *args):
    return model(*args)


def _fresh_copy(fn: Callable, suffix: str) -> Callable:
    """`fn` with a code object of its own, so that dynamo caches (and budgets) its graphs separately."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{suffix}")
    return types.FunctionType(code, fn.__globals__, code.co_name)


class CompiledForward:
    """Calls `model(input_ids, positions, batch, k_caches, v_caches)` through the compiled function of a step kind.

    The model's parameters stay graph inputs (no freezing), so weights loaded in place between steps are used by
    the next step without recompiling.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        register_for_compile(model)  # large CPU products keep their layouts through the custom op
        instance = next(_instances)
        self._compiled = {
            kind: torch.compile(_fresh_copy(_step_forward, f"{kind}_{instance}"), dynamic=True) for kind in STEP_KINDS
        }

    def __call__(self, kind: str, *args) -> torch.Tensor:
        compiled = self._compiled.get(kind)
        if compiled is None:
            raise ValueError(f"Unknown step kind {kind!r}; expected one of {STEP_KINDS}")
        return compiled(self.model, *args)
