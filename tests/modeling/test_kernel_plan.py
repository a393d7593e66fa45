"""CPU linear kernels chosen by measurement: every candidate gives nn.Linear's product, the choice keeps the default
unless another kernel is clearly faster, and plans are cached per host."""

from __future__ import annotations

import json

import pytest
import torch

from verl_tlt.modeling import kernel_plan, linear_kernels
from verl_tlt.modeling.cpu_linear import CpuLayoutLinear
from verl_tlt.modeling.linear_kernels import (
    ROW_BUCKETS,
    apply_kernel,
    available_kernels,
    bucket_of,
    choose_kernel,
    choose_kernels,
    serves,
    weight_layout,
)


@pytest.mark.parametrize("kernel", linear_kernels.KERNELS)
@pytest.mark.parametrize("rows", [1, 3, 37])
def test_every_kernel_computes_nn_linears_product(kernel, rows):
    if kernel not in available_kernels():
        pytest.skip("this host's oneDNN refuses the packed linear in float32 (or VERL_TLT_NO_PACKED_KERNEL is set)")
    weight, bias, x = torch.randn(48, 32), torch.randn(48), torch.randn(rows, 32)
    for b in (bias, None):
        if not serves(kernel, rows):
            with pytest.raises(ValueError, match="one row"):
                apply_kernel(kernel, x, weight, weight_layout(kernel, weight), b)
            continue
        out = apply_kernel(kernel, x, weight, weight_layout(kernel, weight), b)
        assert out.shape == (rows, 48)
        assert torch.allclose(out, torch.nn.functional.linear(x, weight, b), atol=1e-5)


def test_a_single_row_kernel_serves_single_rows_and_leaves_the_rest_to_the_default():
    layer = CpuLayoutLinear(16, 32)
    layer.cpu_layouts = True
    kernel_plan.force_kernel(torch.nn.Sequential(layer), "matrix_vector")
    calls = []
    real_apply = linear_kernels.apply_kernel

    def spy(kernel, flat, *args):
        calls.append((kernel, flat.shape[0]))
        return real_apply(kernel, flat, *args)

    with torch.inference_mode(), pytest.MonkeyPatch.context() as patch:
        patch.setattr("verl_tlt.modeling.cpu_linear.apply_kernel", spy)
        for rows in (1, 2, 0):
            x = torch.randn(rows, 16)
            assert torch.allclose(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias), atol=1e-5)
    assert calls == [("matrix_vector", 1)]


def test_the_default_is_kept_unless_another_kernel_is_clearly_faster():
    assert choose_kernel({"linear": 1.0, "by_column": 0.97, "packed": 0.99}) == "linear"
    assert choose_kernel({"linear": 1.0, "by_column": 0.90, "packed": 0.80}) == "packed"
    assert choose_kernel({"by_column": 0.5, "packed": 0.4}) == "packed"


def test_row_counts_take_the_smallest_measured_bucket_that_holds_them():
    assert [bucket_of(r) for r in (1, 2, 3, 5, 9, 256, 1000)] == [1, 2, 4, 8, 16, 256, 256]


def test_every_shape_gets_a_kernel_that_serves_each_row_count():
    products = [("a", torch.randn(16, 16), None), ("b", torch.randn(8, 16), torch.randn(8))]
    choices = choose_kernels(products, rows=(1, 4), budget_s=0.001)
    assert set(choices) == {1, 4}
    for rows, by_shape in choices.items():
        assert set(by_shape) == {"a", "b"}
        assert all(kernel in available_kernels() and serves(kernel, rows) for kernel in by_shape.values())


def test_a_shape_is_timed_over_all_its_layers_in_passes_over_the_model():
    ticks = iter(range(1_000_000))
    order = []
    real_apply = linear_kernels.apply_kernel

    def spy(kernel, flat, weight, *args):
        order.append((kernel, weight.shape[0]))
        return real_apply(kernel, flat, weight, *args)

    products = [("a", torch.randn(16, 16), None), ("b", torch.randn(8, 16), None), ("a", torch.randn(16, 16), None)]
    assignment = ["by_column", "linear", "by_column"]
    layouts = {kernel: [weight_layout(kernel, w) for _, w, _ in products] for kernel in ("linear", "by_column")}
    inputs = {(16, torch.float32): torch.randn(2, 16)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(linear_kernels, "apply_kernel", spy)
        by_key, total = linear_kernels._time_passes(
            products, assignment, layouts, inputs, budget_s=0, clock=lambda: next(ticks)
        )
    # Every call takes one tick of the fake clock: a pass gives "a" two (its two layers) and "b" one.
    assert by_key == {"a": 2, "b": 1} and total == 3
    assert order[:6] == [("by_column", 16), ("linear", 8), ("by_column", 16)] * 2  # whole passes, in model order


@pytest.mark.parametrize(("mixed_s", "expected"), [(0.5, {"a": "by_column", "b": "packed"}), (0.95, None)])
def test_a_mixture_of_kernels_is_kept_only_if_it_beats_the_best_single_kernel(monkeypatch, mixed_s, expected):
    # Per shape, by_column wins "a" and packed wins "b"; alone, packed is the faster kernel for the whole pass.
    per_shape = {"linear": {"a": 0.5, "b": 0.5}, "by_column": {"a": 0.3, "b": 0.7}, "packed": {"a": 0.4, "b": 0.2}}

    def fake_passes(products, assignment, *args):
        if len(set(assignment)) == 1:
            return per_shape[assignment[0]], sum(per_shape[assignment[0]].values())
        return {}, mixed_s

    monkeypatch.setattr(linear_kernels, "_time_passes", fake_passes)
    products = [("a", torch.randn(4, 4), None), ("b", torch.randn(8, 4), None)]
    choices = choose_kernels(products, rows=(4,), kernels=["linear", "by_column", "packed"])
    assert choices[4] == (expected or {"a": "packed", "b": "packed"})


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = CpuLayoutLinear(16, 32), CpuLayoutLinear(32, 16, bias=False), CpuLayoutLinear(16, 32)


def test_a_plan_is_measured_once_per_shape_and_read_from_the_cache_after(tmp_path):
    model = TwoLayers()
    first = kernel_plan.plan_kernels(model, cache_dir=tmp_path)
    assert first.measured_shapes == 2 and set(first.choices) == {"16x32+bias float32", "32x16 float32"}
    assert model.a.kernel_choices == model.c.kernel_choices == first.choices["16x32+bias float32"]
    again = kernel_plan.plan_kernels(TwoLayers(), cache_dir=tmp_path)
    assert again.measured_shapes == 0 and again.choices == first.choices
    summary = again.summary()
    assert summary["cached_shapes"] == 2 and kernel_plan.host_processor() in summary["host"]


def test_new_shapes_are_measured_in_the_context_of_every_layer_and_cached_ones_kept(tmp_path, monkeypatch):
    kernel_plan.plan_kernels(torch.nn.Sequential(CpuLayoutLinear(16, 32)), cache_dir=tmp_path)
    seen = []
    real_measure = kernel_plan.choose_kernels

    def spy(products, *args, **kwargs):
        seen.append([key for key, _, _ in products])
        return real_measure(products, *args, **kwargs)

    monkeypatch.setattr(kernel_plan, "choose_kernels", spy)
    plan = kernel_plan.plan_kernels(TwoLayers(), cache_dir=tmp_path)
    assert seen == [["16x32+bias float32", "32x16 float32", "16x32+bias float32"]]
    assert plan.measured_shapes == 1 and plan.summary()["cached_shapes"] == 1


def test_a_cache_from_another_host_or_a_broken_file_is_measured_afresh(tmp_path, monkeypatch):
    kernel_plan.plan_kernels(TwoLayers(), cache_dir=tmp_path)
    monkeypatch.setattr(kernel_plan, "host_key", lambda: "another processor | torch 0 | 1 threads | v1")
    assert kernel_plan.plan_kernels(TwoLayers(), cache_dir=tmp_path).measured_shapes == 2
    for path in tmp_path.glob("*.json"):
        path.write_text("{not json")
    assert kernel_plan.plan_kernels(TwoLayers(), cache_dir=tmp_path).measured_shapes == 2


def test_cached_choices_of_unknown_kernels_are_ignored(tmp_path):
    kernel_plan.plan_kernels(TwoLayers(), cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    for by_rows in data["choices"].values():
        by_rows[str(ROW_BUCKETS[0])] = "a-kernel-from-the-future"
    path.write_text(json.dumps(data))
    assert kernel_plan.plan_kernels(TwoLayers(), cache_dir=tmp_path).measured_shapes == 2


def test_a_torch_build_whose_packed_kernel_refuses_is_measured_without_it(tmp_path, monkeypatch):
    real_layout = linear_kernels.weight_layout

    def refusing(kernel, weight):
        if kernel == "packed":
            raise RuntimeError("could not create a primitive")
        return real_layout(kernel, weight)

    monkeypatch.setattr(linear_kernels, "weight_layout", refusing)
    monkeypatch.delenv(linear_kernels.NO_PACKED_ENV, raising=False)
    # As if the probe had passed (it does on hosts with the kernel): the refusal comes from the measurement itself.
    monkeypatch.setattr(linear_kernels, "_packed_usable", {torch.float32: True})
    plan = kernel_plan.plan_kernels(TwoLayers(), cache_dir=tmp_path)
    assert "packed" not in available_kernels() and plan.measured_shapes == 2
    assert all(kernel != "packed" for by_rows in plan.choices.values() for kernel in by_rows.values())


def test_a_refusal_in_one_dtype_keeps_the_packed_kernel_for_the_others(monkeypatch):
    monkeypatch.delenv(linear_kernels.NO_PACKED_ENV, raising=False)
    # An AVX2-only processor refuses packed bf16 and runs packed fp32: a bf16 engine in the process must not take the
    # kernel from fp32 ones.
    monkeypatch.setattr(linear_kernels, "_packed_usable", {torch.float32: True, torch.bfloat16: True})
    linear_kernels.disable_packed_kernel(RuntimeError("bf16 path needs avx512bw"), torch.bfloat16)
    assert "packed" in available_kernels(torch.float32) and "packed" not in available_kernels(torch.bfloat16)
    assert "packed" not in linear_kernels.kernels_for_all({torch.float32, torch.bfloat16})


def test_the_switch_makes_any_host_plan_and_serve_without_the_packed_kernel(tmp_path, monkeypatch):
    monkeypatch.delenv(linear_kernels.NO_PACKED_ENV, raising=False)
    with_packed_host = kernel_plan.host_key()
    monkeypatch.setenv(linear_kernels.NO_PACKED_ENV, "1")
    assert "packed" not in available_kernels(torch.float32) and "packed" not in available_kernels(torch.bfloat16)
    assert kernel_plan.host_key() != with_packed_host  # its plans are cached apart
    plan = kernel_plan.plan_kernels(TwoLayers(), cache_dir=tmp_path)
    assert all(kernel != "packed" for by_rows in plan.choices.values() for kernel in by_rows.values())
    with pytest.raises(ValueError, match="not available"):
        kernel_plan.force_kernel(TwoLayers(), "packed")
    # The size thresholds would pick packed for this product; switched off, it runs without.
    layer = CpuLayoutLinear(512, 512)
    layer.cpu_layouts = True
    x = torch.randn(37, 512)
    with torch.no_grad():
        out = layer(x)
    assert getattr(layer, "_packed", None) is None  # no packed copy was built
    assert torch.allclose(out, torch.nn.functional.linear(x, layer.weight, layer.bias), atol=1e-5)


def test_the_probe_decides_from_a_real_call(monkeypatch):
    monkeypatch.delenv(linear_kernels.NO_PACKED_ENV, raising=False)
    monkeypatch.setattr(linear_kernels, "_packed_usable", {})

    def refusing(*args):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refusing)
    assert not linear_kernels.packed_kernel_available(torch.bfloat16)
    assert linear_kernels._packed_usable == {torch.bfloat16: False}


def test_a_plan_describes_itself_in_one_line(tmp_path):
    plan = kernel_plan.plan_kernels(TwoLayers(), cache_dir=tmp_path)
    line = plan.describe()
    assert line.startswith("2 shapes (2 measured in") and plan.host in line and "of 18 shape x row-count" in line
    assert kernel_plan.force_kernel(TwoLayers(), "by_column").describe() == "by_column forced"


def test_forcing_a_kernel_sets_it_everywhere_and_an_unknown_one_is_refused():
    model = TwoLayers()
    plan = kernel_plan.force_kernel(model, "by_column")
    assert plan.forced == "by_column" and set(model.b.kernel_choices.values()) == {"by_column"}
    with pytest.raises(ValueError, match="not available"):
        kernel_plan.force_kernel(model, "turbo")


def test_a_frozen_layer_with_copies_from_inference_mode_still_passes_gradients_upstream():
    # The drafter trains through the target's frozen head: its copies, built while the engine decoded under
    # inference_mode, must not be saved for backward.
    layer = CpuLayoutLinear(16, 32).requires_grad_(False)
    layer.cpu_layouts = True
    kernel_plan.force_kernel(torch.nn.Sequential(layer), "by_column")
    with torch.inference_mode():
        layer(torch.randn(2, 16))
    x = torch.randn(2, 16, requires_grad=True)
    layer(x).sum().backward()
    assert torch.allclose(x.grad, layer.weight.sum(0).expand(2, 16))


def test_engines_starting_together_share_one_measurement(tmp_path):
    import threading

    plans = []
    threads = [
        threading.Thread(target=lambda: plans.append(kernel_plan.plan_kernels(TwoLayers(), cache_dir=tmp_path)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(plan.measured_shapes for plan in plans) == [0, 0, 2]
    assert plans[0].choices == plans[1].choices == plans[2].choices
