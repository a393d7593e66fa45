"""A target cost model read from the project's own benchmark: seconds per forward, measured, then interpolated.

The numbers come from `verl-tlt bench verify --json PATH`: each row of its JSON is the best-of-repeats time
(`forward_ms`) of one target forward plus logits over `batch_size` rows that each verify `k` draft tokens and the
root, i.e. `width = k + 1` tokens a row, with `context_len` tokens already in every row's KV cache, for one `dtype`
and draft shape (`mode`). `MeasuredCost` keeps one (dtype, mode) slice as a table {(batch, width): seconds} and
prices any step by bilinear interpolation on that grid. What it leaves out: width 1 (a plain decode step) is measured
only when the bench ran with `--ks 0`, else extrapolated from the two smallest widths; the KV length is fixed at the
bench's `context_len`, so `kv_tokens` does not change the price; the drafter, the SD step's own overhead (the JSON's
`sd_overhead`, measured at batch 1 only) and prefill are not in it; and the seconds are those of the bench's
random-weight model on the device, host and thread count that ran it (the JSON names them), so they transfer to
another host or model only as ratios.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REWRITE_HINT = "write it with `verl-tlt bench verify --json PATH`"
ROW_KEYS = ("mode", "dtype", "batch_size", "k", "forward_ms")


@dataclass(frozen=True)
class MeasuredCost:
    """t(batch, width) from a measured grid {(batch, width): seconds}, bilinear in between, linear beyond.

    Bilinear in (batch, width) rather than linear in batch * width tokens alone: a decode forward has a part per
    token (the matmuls over batch * width tokens) and a part per row that does not grow with width (reading the
    row's `context_len` KV tokens in attention). The bench's grid shows both: 64 tokens as batch 1 x width 65 took
    40 ms but as batch 32 x width 2 took 53 ms (host A, bf16, docs/benchmarks.md). Piecewise bilinear reproduces
    a + b * batch + c * width + d * batch * width exactly, which holds both parts (and `LinearCost`).
    """

    table: Mapping[tuple[int, int], float]
    source: str = ""
    model: str | None = None
    dtype: str | None = None
    mode: str | None = None
    context_len: int | None = None
    torch_threads: int | None = None
    batch_sizes: tuple[int, ...] = field(init=False)
    widths: tuple[int, ...] = field(init=False)
    min_seconds: float = field(init=False)

    def __post_init__(self) -> None:
        table = _checked_table(self.table, self.source)
        object.__setattr__(self, "table", table)
        object.__setattr__(self, "batch_sizes", tuple(sorted({batch for batch, _ in table})))
        object.__setattr__(self, "widths", tuple(sorted({width for _, width in table})))
        object.__setattr__(self, "min_seconds", min(table.values()))

    @classmethod
    def from_verify_json(cls, path: str | Path, dtype: str | None = None, mode: str = "chain") -> MeasuredCost:
        """The (dtype, mode) slice of a `bench verify` JSON; dtype None: the file's only dtype."""
        try:
            result = json.loads(Path(path).read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON ({error}); {REWRITE_HINT}") from error
        return cls.from_verify_result(result, str(path), dtype, mode)

    @classmethod
    def from_verify_result(
        cls, result: Any, source: str, dtype: str | None = None, mode: str = "chain"
    ) -> MeasuredCost:
        """As `from_verify_json`, from the already parsed result (`source` names it in errors)."""
        rows = _verify_rows(result, source)
        dtype = _pick(source, "dtype", dtype, sorted({row["dtype"] for row in rows}))
        mode = _pick(source, "mode", mode, sorted({row["mode"] for row in rows}))
        table: dict[tuple[int, int], float] = {}
        for row in rows:
            if row["dtype"] != dtype or row["mode"] != mode:
                continue
            cell = (row["batch_size"], row["k"] + 1)  # k drafts plus the root: k + 1 tokens a row
            if cell in table:
                raise ValueError(
                    f"{source}: two rows for dtype={dtype!r} mode={mode!r} batch_size={cell[0]} k={cell[1] - 1} "
                    f"(results of several runs merged?); keep one run's rows or {REWRITE_HINT}"
                )
            table[cell] = row["forward_ms"] / 1e3
        return cls(
            table,
            source,
            model=result.get("model"),
            dtype=dtype,
            mode=mode,
            context_len=result.get("context_len"),
            torch_threads=result.get("torch_threads"),
        )

    def step_seconds(self, batch: int, width: int = 1, kv_tokens: int = 0) -> float:
        """Seconds of one target forward over `batch` rows of `width` tokens each.

        kv_tokens (the KV cache of the whole batch) is checked but does not change the price: the bench measured
        one context length (`context_len` tokens a row), so there is no data on how the cost moves with it.
        """
        if batch < 1 or width < 1 or kv_tokens < 0:
            raise ValueError(
                f"a decode step needs batch >= 1, width >= 1 and kv_tokens >= 0, got batch={batch}, width={width}, "
                f"kv_tokens={kv_tokens}"
            )
        # Along width within each measured batch, then along batch: bilinear on the grid, linear beyond it.
        per_batch = [
            _interpolate(self.widths, [self.table[(b, w)] for w in self.widths], width) for b in self.batch_sizes
        ]
        seconds = _interpolate(self.batch_sizes, per_batch, batch)
        # Extrapolating a noisy grid can dip below anything measured (even below 0); no forward is cheaper than the
        # cheapest one measured.
        return max(seconds, self.min_seconds)


def _interpolate(xs: Sequence[int], ys: Sequence[float], x: int) -> float:
    """Piecewise-linear y(x) through sorted points (at least two), extended by the first or last two points."""
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)  # the segment [xs[i-1], xs[i]] holding x, or nearest
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _checked_table(table: Mapping[tuple[int, int], float], source: str) -> dict[tuple[int, int], float]:
    """A copy of `table` if it is a full grid of positive seconds with at least two batches and two widths."""
    where = source or "MeasuredCost table"
    if not table:
        raise ValueError(f"{where}: the table is empty; it needs seconds for a grid of (batch, width) cells")
    checked: dict[tuple[int, int], float] = {}
    for cell, seconds in table.items():
        if not (isinstance(cell, tuple) and len(cell) == 2 and all(isinstance(n, int) and n >= 1 for n in cell)):
            raise ValueError(f"{where}: keys must be (batch, width) with both ints >= 1, got {cell!r}")
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"{where}: seconds must be a finite number > 0, got {seconds!r} at {cell}")
        checked[cell] = float(seconds)
    batches, widths = sorted({b for b, _ in checked}), sorted({w for _, w in checked})
    if len(batches) < 2 or len(widths) < 2:
        raise ValueError(
            f"{where}: needs at least two batch sizes and two widths to interpolate, got batches {batches} and "
            f"widths {widths}; measure more (`verl-tlt bench verify --batch-sizes 1 4 16 --ks 1 4 16`)"
        )
    missing = [(b, w) for b in batches for w in widths if (b, w) not in checked]
    if missing:
        raise ValueError(f"{where}: not a full grid, missing (batch, width) cells {missing}; measure every pair")
    return checked


def _verify_rows(result: Any, source: str) -> list[dict]:
    """The rows of a `bench verify` result, each checked for the keys the table is built from."""
    if not isinstance(result, dict):
        raise ValueError(f"{source}: expected a JSON object, got {type(result).__name__}; {REWRITE_HINT}")
    if result.get("benchmark") != "verify":
        raise ValueError(
            f"{source}: benchmark is {result.get('benchmark')!r}, not 'verify' (the output of another command?); "
            f"{REWRITE_HINT}"
        )
    rows = result.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{source}: 'rows' must be a non-empty list, got {rows!r}; {REWRITE_HINT}")
    for index, row in enumerate(rows):
        missing = [key for key in ROW_KEYS if not isinstance(row, dict) or key not in row]
        if missing:
            raise ValueError(f"{source}: rows[{index}] lacks {missing}; {REWRITE_HINT}")
        if not all(isinstance(row[key], int) and not isinstance(row[key], bool) for key in ("batch_size", "k")):
            raise ValueError(
                f"{source}: rows[{index}] batch_size and k must be ints, got {row['batch_size']!r}, {row['k']!r}"
            )
        if not isinstance(row["forward_ms"], (int, float)) or isinstance(row["forward_ms"], bool):
            raise ValueError(f"{source}: rows[{index}] forward_ms must be a number, got {row['forward_ms']!r}")
    return rows


def _pick(source: str, key: str, wanted: str | None, present: list[str]) -> str:
    """`wanted` if the file has rows for it; None picks the file's only value."""
    if wanted is None and len(present) == 1:
        return present[0]
    if wanted is None or wanted not in present:
        got = "none given" if wanted is None else f"{wanted!r} has no rows"
        raise ValueError(f"{source}: {key} must be one of {present} ({got}); pass {key}=<one of them>")
    return wanted
