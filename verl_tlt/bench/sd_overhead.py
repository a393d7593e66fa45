"""The SD step's own overhead, for `verl-tlt bench verify`: what a speculative step costs beyond its two models.

At batch 1, real speculative steps `engine.step(strategy)` run with a cheap stateless drafter (the target's
embedding -> final norm -> LM head, no layers; it still asks for hidden states like an EAGLE head, so the engine's
hidden-state bookkeeping is included). Each step is timed whole, along with the target forward inside it
(`engine.runner.forward` + `engine.model.logits`) and the drafter calls (`begin` + `expand`). Overhead = step - target -
drafter: the tree search, masks, sampling/verification, KV compaction and bookkeeping. The fraction is summed
overhead / summed step time over the measured steps after warm-up. On CUDA every timed call (and the step) is
bracketed by a synchronize, so each part's kernels count in that part and not in whichever part next waits for the
device; the added waits cost microseconds a call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from verl_tlt.bench.engine_bench import synchronizer
from verl_tlt.engine import RolloutEngine
from verl_tlt.engine.drafts.base import DraftContext, Drafter

SD_STRATEGIES = ("6_4_16", "4_1_4")


class EmbeddingDrafter(Drafter):
    """A cheap stateless drafter from the target's own weights: embedding -> final norm -> LM head (no layers).

    It asks for the target's hidden states (like an EAGLE head) so the engine's bookkeeping for them is measured,
    but ignores them. Its LM head is applied with F.linear, not `model.logits`, so timing wrappers on the target's
    `logits` never count drafter work as target work.
    """

    uses_hidden_states = True

    def __init__(self, model: torch.nn.Module):
        self.embed, self.norm = model.model.embed_tokens, model.model.norm
        self.head_weight = model.lm_head.weight

    @property
    def vocab_size(self) -> int:
        return self.head_weight.shape[0]

    def begin(self, rows: list[DraftContext]) -> torch.Tensor:
        roots = torch.tensor([row.token_ids[-1] for row in rows], device=self.head_weight.device)
        return self._logits(roots)

    def expand(self, node_ids: torch.Tensor, parent_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self._logits(tokens)

    def _logits(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(self.embed(tokens)), self.head_weight)


_UNSET = object()


def _no_sync() -> None:
    pass


@dataclass
class Stopwatch:
    """Seconds accumulated by the calls wrapped with `wrap`; `sync` waits for the device before each clock read."""

    seconds: float = 0.0
    sync: Callable[[], None] = field(default=_no_sync)

    def wrap(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            self.sync()  # work queued before the call is not the call's
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.seconds += time.perf_counter() - start

        return timed


def instrument(engine: RolloutEngine, drafter: Drafter) -> tuple[Stopwatch, Stopwatch]:
    """Wrap the target forward (+ logits) and the drafter calls of `engine` with stopwatches (instance attributes;
    `engine.model.logits` stays wrapped until `del engine.model.logits`)."""
    sync = synchronizer(engine.device)
    target, draft = Stopwatch(sync=sync), Stopwatch(sync=sync)
    engine.runner.forward = target.wrap(engine.runner.forward)
    engine.model.logits = target.wrap(engine.model.logits)
    drafter.begin = draft.wrap(drafter.begin)
    drafter.expand = draft.wrap(drafter.expand)
    return target, draft


def bench_sd_overhead(engine: RolloutEngine, strategy: str, steps: int, warmup: int) -> dict:
    """Mean step / target / drafter / overhead times of `steps` speculative steps of `engine`'s one running request.

    `engine` has its drafter and one prefilled request; the timed calls are unwrapped again on return, since the
    model may serve other engines and the engine other measurements afterwards.
    """
    drafter = engine.drafter
    for _ in range(warmup):
        engine.step(strategy)
    sync = synchronizer(engine.device)
    wrapped = [(engine.runner, "forward"), (engine.model, "logits"), (drafter, "begin"), (drafter, "expand")]
    before = [(owner, name, vars(owner).get(name, _UNSET)) for owner, name in wrapped]
    target, draft = instrument(engine, drafter)
    step_s = 0.0
    try:
        for _ in range(steps):
            sync()
            start = time.perf_counter()
            engine.step(strategy)
            sync()
            step_s += time.perf_counter() - start
    finally:
        for owner, name, value in before:  # each wrapper is an instance attribute shadowing the method
            if value is _UNSET:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
    if not engine.running:
        raise RuntimeError("the request finished during the measured steps; lower the number of steps")
    request = engine.running[0]
    overhead_s = step_s - target.seconds - draft.seconds
    return {
        "strategy": strategy,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "steps": steps,
        "step_ms": round(step_s / steps * 1e3, 3),
        "target_forward_ms": round(target.seconds / steps * 1e3, 3),
        "drafter_ms": round(draft.seconds / steps * 1e3, 3),
        "overhead_ms": round(overhead_s / steps * 1e3, 3),
        "overhead_fraction": round(overhead_s / step_s, 4),
        # Tokens emitted per verify step (accepted drafts + the bonus token), warm-up steps included.
        "tokens_per_step": round(
            (request.num_accepted_tokens + request.num_verify_steps) / request.num_verify_steps, 3
        ),
    }


def print_sd(entry: dict) -> None:
    print(
        f"sd step {entry['strategy']:>7} bs=1 {entry['dtype']}: step {entry['step_ms']:.2f} ms = target "
        f"{entry['target_forward_ms']:.2f} + drafter {entry['drafter_ms']:.2f} + overhead {entry['overhead_ms']:.2f} "
        f"ms ({100 * entry['overhead_fraction']:.1f}% of the step), {entry['tokens_per_step']:.2f} tokens/step",
        flush=True,
    )
