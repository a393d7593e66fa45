"""What the drafter's self-test costs a replica (`verl_tlt.engine.drafts.self_test`), part of `verl-tlt bench sd curve`.

The bench's engine and drafter, the first bench prompt as the probe, `tlt.drafter`'s default probe length: the first
check (which also decodes the probe's answer once) and the best of REPEATS later checks, each a target forward over
the probe and a drafter call at its cut points. The engine is left empty.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from verl_tlt.config import DrafterConfig
from verl_tlt.engine import RolloutEngine
from verl_tlt.engine.drafts.self_test import DrafterSelfTest

REPEATS = 3


def self_test_cost(engine: RolloutEngine, prompt: Sequence[int]) -> dict | None:
    """Seconds of the first and of a later self-test check; None when the prompt leaves no room for the probe."""
    defaults = DrafterConfig()
    test = DrafterSelfTest(defaults.self_test_tokens, defaults.self_test_min_ratio, engine.max_model_len)
    test.remember(prompt)
    if not test.probes:
        return None
    start = time.perf_counter()
    first = test.check(engine)
    first_s = time.perf_counter() - start
    later = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        test.check(engine)
        later.append(time.perf_counter() - start)
    return {
        "probe_tokens": defaults.self_test_tokens,
        "positions": first.score.drafted,
        "first_check_s": round(first_s, 4),
        "check_s": round(min(later), 4),
        "agreement": round(first.score.rate, 3),
    }


def print_self_test_cost(cost: dict | None) -> None:
    if cost is None:
        print("drafter self-test: not timed (the first prompt leaves no room for the probe)")
        return
    print(
        f"drafter self-test: {1000 * cost['check_s']:.0f} ms a check ({cost['positions']} positions of a "
        f"{cost['probe_tokens']}-token probe answer; the first check {cost['first_check_s']:.2f} s, decoding that "
        f"answer once); first-draft agreement {cost['agreement']:.2f}",
        flush=True,
    )
