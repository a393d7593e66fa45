"""MeasuredCost: a grid of measured forward times, interpolated, extrapolated and read from `bench verify` JSON."""

from __future__ import annotations

import copy
import json

import pytest

from verl_tlt.sim.costs import LinearCost
from verl_tlt.sim.measured_cost import MeasuredCost

# The shape `verl-tlt bench verify --json` writes (verify_bench.run builds it inline, with no pure builder to call):
# copied from `bench verify --model qwen2-tiny --dtypes float32 --modes chain tree --batch-sizes 1 4 --ks 1 4
# --context-len 32 --repeats 1 --sd-steps 2`.
VERIFY_RESULT = {
    "benchmark": "verify",
    "model": "qwen2-tiny",
    "params_m": 0.1,
    "context_len": 32,
    "torch_threads": 2,
    "timing": "verify: best of repeats after one warm-up; target forward + logits at every node, layout excluded; "
    "tree mode: breadth-first, 4 children per node",
    "rows": [
        {"mode": "chain", "dtype": "float32", "batch_size": 1, "k": 1, "cost_vs_k1": 1.0, "forward_ms": 0.403},
        {"mode": "chain", "dtype": "float32", "batch_size": 1, "k": 4, "cost_vs_k1": 1.0514, "forward_ms": 0.423},
        {"mode": "tree", "dtype": "float32", "batch_size": 1, "k": 1, "cost_vs_k1": 1.0, "forward_ms": 0.372},
        {"mode": "tree", "dtype": "float32", "batch_size": 1, "k": 4, "cost_vs_k1": 1.0743, "forward_ms": 0.4},
        {"mode": "chain", "dtype": "float32", "batch_size": 4, "k": 1, "cost_vs_k1": 1.0, "forward_ms": 0.427},
        {"mode": "chain", "dtype": "float32", "batch_size": 4, "k": 4, "cost_vs_k1": 1.034, "forward_ms": 0.441},
        {"mode": "tree", "dtype": "float32", "batch_size": 4, "k": 1, "cost_vs_k1": 1.0, "forward_ms": 0.402},
        {"mode": "tree", "dtype": "float32", "batch_size": 4, "k": 4, "cost_vs_k1": 1.2266, "forward_ms": 0.493},
    ],
    "sd_drafter": "target embedding -> final norm -> LM head (no layers), hidden-state bookkeeping on",
    "sd_overhead": [
        {
            "strategy": "6_4_16",
            "steps": 2,
            "step_ms": 1.437,
            "target_forward_ms": 0.519,
            "drafter_ms": 0.185,
            "overhead_ms": 0.733,
            "overhead_fraction": 0.5099,
            "tokens_per_step": 3.0,
        },
    ],
    "sd_overhead_fraction_bs1": 0.5099,
    "sd_overhead_fraction_bs1_source": "max over strategies: 6_4_16 (float32, batch 1)",
    "sd_overhead_fraction_target": 0.1,
}

# Host A's bf16 chain grid (docs/benchmarks.md), ms: batch -> times at k = 1, 2, 4, 8, 16, 32, 64.
HOST_A_K1_MS = {1: 14, 4: 17, 16: 32, 32: 53}
HOST_A_RATIOS = {
    1: [1.0, 1.02, 1.05, 1.12, 1.37, 1.89, 2.86],
    4: [1.0, 1.14, 1.25, 1.66, 2.29, 4.04, 7.87],
    16: [1.0, 1.23, 1.59, 2.32, 4.14, 8.46, 16.16],
    32: [1.0, 1.30, 1.74, 2.87, 5.09, 10.32, 19.22],
}
HOST_A = MeasuredCost(
    {
        (batch, k + 1): HOST_A_K1_MS[batch] * ratio / 1e3
        for batch, ratios in HOST_A_RATIOS.items()
        for k, ratio in zip([1, 2, 4, 8, 16, 32, 64], ratios, strict=True)
    },
    "host A bf16",
)

# A small grid with hand-checkable values: batches 1 and 3, widths 2 and 4.
SMALL = MeasuredCost({(1, 2): 1.0, (1, 4): 3.0, (3, 2): 5.0, (3, 4): 11.0})


def write(tmp_path, result, name="verify.json"):
    path = tmp_path / name
    path.write_text(json.dumps(result))
    return path


def test_grid_points_cost_exactly_what_was_measured():
    for (batch, width), seconds in SMALL.table.items():
        assert SMALL.step_seconds(batch, width) == seconds
    assert SMALL.batch_sizes == (1, 3) and SMALL.widths == (2, 4)


def test_midpoints_interpolate_bilinearly():
    assert SMALL.step_seconds(1, 3) == pytest.approx(2.0)
    assert SMALL.step_seconds(2, 2) == pytest.approx(3.0)
    # Width first: 2.0 at batch 1 and 8.0 at batch 3, then halfway along batch.
    assert SMALL.step_seconds(2, 3) == pytest.approx(5.0)


def test_beyond_the_grid_extends_the_last_two_points():
    assert SMALL.step_seconds(1, 6) == pytest.approx(5.0)  # +1 s per width at batch 1
    assert SMALL.step_seconds(5, 2) == pytest.approx(9.0)  # +2 s per batch row at width 2
    assert SMALL.step_seconds(5, 6) == pytest.approx(5.0 + (17.0 - 5.0) * 2)  # 17 s at (3, 6)


def test_a_bilinear_cost_is_reproduced_everywhere_even_plain_steps_the_bench_never_measures():
    linear = LinearCost(fixed_s=0.01, per_token_s=0.001)
    # Widths from 2, as the bench measures them (k >= 1): plain steps (width 1) are extrapolated.
    measured = MeasuredCost({(b, w): linear.step_seconds(b, w) for b in (1, 8, 32) for w in (2, 5, 17)})
    for batch in (2, 5, 8, 20, 64):
        for width in (1, 2, 3, 17, 40):
            assert measured.step_seconds(batch, width) == pytest.approx(linear.step_seconds(batch, width))
    # Except below the cheapest cell: a plain step at batch 1 costs no less than verifying one draft there.
    assert linear.step_seconds(1, 1) < measured.min_seconds == measured.step_seconds(1, 1) == linear.step_seconds(1, 2)


def test_extrapolation_never_goes_below_the_cheapest_measurement():
    # Cost climbs steeply from width 2 to 3 (noise): the line through them is negative at width 1.
    noisy = MeasuredCost({(1, 2): 1.0, (1, 3): 3.0, (2, 2): 2.0, (2, 3): 3.5})
    assert noisy.step_seconds(1, 1) == noisy.min_seconds == 1.0


def test_a_monotone_measured_grid_gives_costs_monotone_in_batch_and_width():
    batches, widths = range(1, 65), [1, 2, 3, 5, 9, 12, 17, 33, 50, 65, 80]
    costs = {(b, w): HOST_A.step_seconds(b, w) for b in batches for w in widths}
    for batch in batches:
        row = [costs[(batch, width)] for width in widths]
        assert row == sorted(row), f"not monotone in width at batch {batch}"
    for width in widths:
        column = [costs[(batch, width)] for batch in batches]
        assert column == sorted(column), f"not monotone in batch at width {width}"


def test_kv_tokens_is_checked_but_does_not_change_the_price():
    assert SMALL.step_seconds(2, 3, kv_tokens=10_000) == SMALL.step_seconds(2, 3)
    with pytest.raises(ValueError, match="kv_tokens=-1"):
        SMALL.step_seconds(2, 3, kv_tokens=-1)


@pytest.mark.parametrize(("batch", "width"), [(0, 1), (1, 0), (-3, 2)])
def test_a_step_needs_a_batch_and_a_width(batch, width):
    with pytest.raises(ValueError, match=f"batch={batch}, width={width}"):
        SMALL.step_seconds(batch, width)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({}, "table is empty"),
        ({(1, 2): 1.0, (1, 3): 2.0}, r"two batch sizes and two widths.*batches \[1\]"),
        ({(1, 2): 1.0, (2, 2): 2.0}, r"two batch sizes and two widths.*widths \[2\]"),
        ({(1, 2): 1.0, (1, 3): 2.0, (2, 2): 2.0}, r"missing \(batch, width\) cells \[\(2, 3\)\]"),
        ({(1, 2): 1.0, (1, 3): 0.0, (2, 2): 2.0, (2, 3): 3.0}, r"> 0, got 0.0 at \(1, 3\)"),
        ({(0, 2): 1.0}, r"ints >= 1, got \(0, 2\)"),
    ],
)
def test_a_table_that_is_not_a_full_positive_grid_is_refused(table, message):
    with pytest.raises(ValueError, match=message):
        MeasuredCost(table)


def test_a_verify_json_gives_its_chain_slice_with_width_k_plus_one(tmp_path):
    path = write(tmp_path, VERIFY_RESULT)
    cost = MeasuredCost.from_verify_json(path)
    assert cost.table == pytest.approx({(1, 2): 0.403e-3, (1, 5): 0.423e-3, (4, 2): 0.427e-3, (4, 5): 0.441e-3})
    assert (cost.source, cost.model, cost.dtype, cost.mode) == (str(path), "qwen2-tiny", "float32", "chain")
    assert (cost.context_len, cost.torch_threads) == (32, 2)
    assert MeasuredCost.from_verify_json(path, mode="tree").step_seconds(4, 5) == pytest.approx(0.493e-3)


def test_a_file_with_several_dtypes_needs_one_named(tmp_path):
    result = copy.deepcopy(VERIFY_RESULT)
    result["rows"] += [dict(row, dtype="bfloat16", forward_ms=row["forward_ms"] / 2) for row in result["rows"]]
    path = write(tmp_path, result)
    with pytest.raises(ValueError, match=r"dtype must be one of \['bfloat16', 'float32'\] \(none given\)"):
        MeasuredCost.from_verify_json(path)
    cost = MeasuredCost.from_verify_json(path, dtype="bfloat16")
    assert cost.step_seconds(1, 2) == pytest.approx(0.403e-3 / 2)


def test_a_dtype_or_mode_the_file_lacks_is_refused_with_the_choices(tmp_path):
    path = write(tmp_path, VERIFY_RESULT)
    with pytest.raises(ValueError, match=r"dtype must be one of \['float32'\] \('bfloat16' has no rows\)"):
        MeasuredCost.from_verify_json(path, dtype="bfloat16")
    only_tree = dict(VERIFY_RESULT, rows=[row for row in VERIFY_RESULT["rows"] if row["mode"] == "tree"])
    with pytest.raises(ValueError, match=r"mode must be one of \['tree'\] \('chain' has no rows\); pass mode="):
        MeasuredCost.from_verify_json(write(tmp_path, only_tree, "tree.json"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is not valid JSON"),
        ("{not json", "is not valid JSON"),
        ("[]", "expected a JSON object, got list"),
        (json.dumps({"benchmark": "sd", "rows": []}), "benchmark is 'sd', not 'verify'"),
        (json.dumps({"results": []}), "benchmark is None, not 'verify'"),
        (json.dumps(dict(VERIFY_RESULT, rows=[])), "'rows' must be a non-empty list"),
        (json.dumps(dict(VERIFY_RESULT, rows=[{"mode": "chain", "k": 1}])), r"rows\[0\] lacks \['dtype'"),
    ],
)
def test_a_file_that_is_not_a_verify_result_names_itself_and_the_command_that_writes_one(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        MeasuredCost.from_verify_json(path)
    assert str(path) in str(error.value)
    assert "verl-tlt bench verify --json PATH" in str(error.value)


def test_rows_of_two_runs_merged_into_one_file_are_refused(tmp_path):
    result = dict(VERIFY_RESULT, rows=VERIFY_RESULT["rows"] + VERIFY_RESULT["rows"][:1])
    with pytest.raises(ValueError, match="two rows for dtype='float32' mode='chain' batch_size=1 k=1"):
        MeasuredCost.from_verify_json(write(tmp_path, result))
