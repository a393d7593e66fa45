"""The warm-up's own optimizer settings, apart from `tlt.drafter`'s, which are for fine-tuning online.

A warm-up starts its drafter further from its goal than online training does (a zeroed-branch copy of the target's
last layer, `EagleDrafterModel.from_target`). Measured on SmolLM2's warm-up data (docs/benchmarks.md): from that
start, lr 1e-3 with a gradient clip of 5 reached 1.3x the held-out top-1 agreement of lr 1e-3 with EAGLE's clip of
0.5 after 100 steps, and lr 3e-3 diverged.
"""

WARMUP_LR = 1e-3
WARMUP_GRAD_CLIP_NORM = 5.0
