"""Random draws for a batch of rows where some rows carry their own generator (seeded requests).

A seeded request's samples must not depend on its batch company, so its draws come from its own generator one row
at a time; the other rows share the default generator and are drawn together in one call per consecutive run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# draw(generator, count) -> a tensor whose first dimension is `count` (one entry per row, in row order).
DrawFn = Callable[[torch.Generator | None, int], torch.Tensor]


def draw_rows(
    rows: list[int], generators: list[torch.Generator | None], default_generator: torch.Generator | None, draw: DrawFn
) -> torch.Tensor:
    """Concatenate draw(generator, n) over `rows` (indices into `generators`) in order."""
    pieces, run = [], 0
    for row in rows:
        if generators[row] is None:
            run += 1
            continue
        if run:
            pieces.append(draw(default_generator, run))
            run = 0
        pieces.append(draw(generators[row], 1))
    if run:
        pieces.append(draw(default_generator, run))
    return torch.cat(pieces)


def multinomial_rows(dists: torch.Tensor) -> DrawFn:
    """A draw function taking one sample from each row of `dists` [S, V], rows consumed in order."""
    offset = 0

    def draw(generator: torch.Generator | None, count: int) -> torch.Tensor:
        nonlocal offset
        chunk = dists[offset : offset + count]
        offset += count
        return torch.multinomial(chunk, 1, generator=generator).view(-1)

    return draw
