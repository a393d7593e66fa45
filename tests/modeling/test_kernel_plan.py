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
    measure_kernels,
    serves,
    weight_layout,
)


@pytest.mark.parametrize("kernel", linear_kernels.KERNELS)
@pytest.mark.parametrize("rows", [1, 3, 37])
def test_every_kernel_computes_nn_linears_product(kernel, rows):
    if kernel not in available_kernels():
        pytest.skip("this torch build has no oneDNN packed linear")
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


def test_measurement_times_every_kernel_at_every_row_count():
    timings = measure_kernels(torch.randn(16, 16), None, rows=(1, 4), budget_s=0.001)
    assert set(timings) == {1, 4}
    for rows, cell in timings.items():
        assert set(cell) == {kernel for kernel in available_kernels() if serves(kernel, rows)}
    assert all(seconds > 0 for cell in timings.values() for seconds in cell.values())


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


def test_weights_are_measured_cold_at_the_models_own_reuse_distance(tmp_path, monkeypatch):
    seen = []
    real_measure = kernel_plan.measure_kernels

    def spy(*args, cold_bytes, **kwargs):
        seen.append(cold_bytes)
        return real_measure(*args, cold_bytes=cold_bytes, **kwargs, budget_s=0.001)

    monkeypatch.setattr(kernel_plan, "measure_kernels", spy)
    model = TwoLayers()
    kernel_plan.plan_kernels(model, cache_dir=tmp_path)
    model_bytes = sum(layer.weight.numel() * 4 for layer in (model.a, model.b, model.c))
    assert seen == [model_bytes, model_bytes]


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
