"""Continuous batching, stopping rules and seeds of the torch engine."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import EOS, assert_same_outputs
from verl_tlt.engine import RolloutEngine, SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20], [21], [30, 31, 32]]


@pytest.fixture()
def engine(tiny_qwen2):
    return RolloutEngine.from_pretrained(str(tiny_qwen2[0]), max_num_seqs=3)


def solo(engine, prompt, params):
    return engine.generate([prompt], params)[0]


def test_batched_greedy_equals_one_at_a_time(engine):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    batched = engine.generate(PROMPTS, params)  # max_num_seqs=3: requests wait, join and leave mid-run
    for prompt, output in zip(PROMPTS, batched, strict=True):
        alone = solo(engine, prompt, params)
        assert output.token_ids == alone.token_ids
        assert torch.allclose(torch.tensor(output.log_probs), torch.tensor(alone.log_probs), atol=1e-5)


def test_mixed_max_tokens_leave_the_batch_independently(engine):
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (1, 7, 3, 12, 5)]
    outputs = engine.generate(PROMPTS, params)
    assert [len(o.token_ids) for o in outputs] == [1, 7, 3, 12, 5]
    for prompt, p, output in zip(PROMPTS, params, outputs, strict=True):
        assert (
            solo(engine, prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)).token_ids[
                : p.max_tokens
            ]
            == output.token_ids
        )


def test_generate_tells_progress_the_finished_requests_after_every_step(engine):
    seen = []

    class Counting:
        def update(self, done):
            seen.append(done)

    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (1, 7, 3, 12, 5)]
    outputs = engine.generate(PROMPTS, params, progress=Counting())
    assert seen == sorted(seen) and seen[-1] == len(PROMPTS) and len(seen) > len(PROMPTS)
    assert [len(o.token_ids) for o in outputs] == [1, 7, 3, 12, 5]


def test_stop_token_ends_the_request_and_is_kept(engine):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    reference = solo(engine, PROMPTS[0], params).token_ids
    stop = reference[4]
    first = reference.index(stop)
    output = solo(
        engine, PROMPTS[0], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop], ignore_eos=True)
    )
    assert output.token_ids == reference[: first + 1]
    assert output.finish_reason == "stop" and output.stop_token_id == stop


def test_eos_stops_unless_ignored(engine):
    # Make EOS the greedy choice everywhere by pushing its LM-head row up.
    with torch.no_grad():
        engine.model.lm_head.weight[EOS] += 5.0 * engine.model.lm_head.weight.abs().max()
    stopped = solo(engine, PROMPTS[1], SamplingParams(temperature=0, max_tokens=10))
    assert stopped.token_ids == [EOS] and stopped.finish_reason == "stop"
    ignored = solo(engine, PROMPTS[1], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert len(ignored.token_ids) == 10 and ignored.finish_reason == "length"


def test_max_model_len_caps_generation(tiny_qwen2):
    engine = RolloutEngine.from_pretrained(str(tiny_qwen2[0]), max_model_len=12)
    output = solo(engine, PROMPTS[0], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    assert len(PROMPTS[0]) + len(output.token_ids) == 12 and output.finish_reason == "length"
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(list(range(5, 17)), SamplingParams())


def test_seeded_samples_do_not_depend_on_batch_company(engine):
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=7)
    alone = solo(engine, PROMPTS[2], params)
    others = [SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=s) for s in (1, 2, 3, 4)]
    batched = engine.generate(
        [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3], PROMPTS[4]],
        [others[0], others[1], params, others[2], others[3]],
    )
    assert batched[2].token_ids == alone.token_ids
    different_seed = solo(engine, PROMPTS[2], SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=8))
    assert different_seed.token_ids != alone.token_ids


def test_top_k_one_is_greedy(engine):
    greedy = solo(engine, PROMPTS[0], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    top1 = solo(engine, PROMPTS[0], SamplingParams(temperature=1.3, top_k=1, max_tokens=12, ignore_eos=True, seed=0))
    assert top1.token_ids == greedy.token_ids
    assert all(abs(lp) < 1e-6 for lp in top1.log_probs)  # processed distribution is one-hot


def test_abort_returns_partial_output(engine):
    request_id = engine.add_request(PROMPTS[0], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    for _ in range(4):
        engine.step()
    engine.abort(request_id)
    (output,) = engine.step()
    assert output.finish_reason == "abort" and 1 <= len(output.token_ids) < 50
    assert not engine.has_unfinished()


@pytest.mark.parametrize("tokens_left", [1, 30])
def test_an_aborted_request_gets_no_further_token(engine, tokens_left):
    """Abort takes effect at the next step: the row waits for retirement without growing, as in a speculative step,
    so its finish reason stays 'abort' even when one more token would have reached max_tokens."""
    params = SamplingParams(temperature=0, max_tokens=3 + tokens_left, ignore_eos=True)
    request_id = engine.add_request(PROMPTS[0], params)
    engine.add_request(PROMPTS[1], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))  # runs on beside it
    for _ in range(3):  # prefill (the first token), then two more
        engine.step()
    emitted = len(next(r for r in engine.running if r.request_id == request_id).output_ids)
    engine.abort(request_id)
    (output,) = engine.step()
    assert output.request_id == request_id and output.finish_reason == "abort"
    assert len(output.token_ids) == emitted


def test_a_bad_prompt_queues_none_of_the_batch(engine):
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([PROMPTS[0], [5, 10_000]], SamplingParams(max_tokens=4))
    assert not engine.has_unfinished()  # the good prompt before it was not left queued either
    with pytest.raises(ValueError, match=r"outside the model's vocabulary"):
        engine.add_request([-1, 5], SamplingParams())


def test_load_weights_changes_outputs_and_rejects_unknown_names(engine):
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    before = solo(engine, PROMPTS[0], params).token_ids
    # transformers names, as verl sends them (q/k/v and gate/up land in the engine's fused projections).
    state = {k: v.clone() for k, v in engine.model.hf_weight_views().items()}
    assert "model.layers.0.self_attn.k_proj.weight" in state and "model.layers.0.mlp.up_proj.weight" in state
    state["model.norm.weight"] = -state["model.norm.weight"]
    engine.load_weights(state.items())
    assert solo(engine, PROMPTS[0], params).token_ids != before
    with pytest.raises(ValueError, match="Unknown weight"):
        engine.load_weights([("model.not_a_weight", torch.zeros(1))])


@pytest.mark.parametrize("kernel", ["by_column", "packed"])
def test_cpu_layouts_follow_weight_loads(tiny_qwen2, kernel):
    # CPU forwards serve from transposed or packed weight copies; a weight sync must refresh them. The kernel is
    # forced: a measured plan may pick the BLAS call (no copy) for these small shapes on some hosts.
    from verl_tlt.modeling import linear_kernels

    if kernel == "packed" and not linear_kernels.packed_kernel_available():
        pytest.skip("this host's oneDNN refuses the packed linear in float32 (or VERL_TLT_NO_PACKED_KERNEL is set)")
    path = str(tiny_qwen2[0])
    with_layouts = RolloutEngine.from_pretrained(path, cpu_layouts=True, cpu_kernels=kernel)
    without = RolloutEngine.from_pretrained(path, cpu_layouts=False)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    assert solo(with_layouts, PROMPTS[0], params).token_ids == solo(without, PROMPTS[0], params).token_ids
    assert getattr(with_layouts.model.lm_head, f"_{kernel}") is not None  # the batch-1 decode used the copy
    generator = torch.Generator().manual_seed(0)
    update = {
        k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in without.model.hf_weight_views().items()
    }
    for engine in (with_layouts, without):
        engine.load_weights((k, v.clone()) for k, v in update.items())
    a, b = solo(with_layouts, PROMPTS[0], params), solo(without, PROMPTS[0], params)
    assert a.token_ids == b.token_ids
    assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 37], ids=["transposed", "transposed_2_rows", "packed_padded"])
def test_cpu_layouts_match_nn_linear_and_never_serve_a_forward_that_trains(rows):
    from verl_tlt.modeling import cpu_linear, linear_kernels
    from verl_tlt.modeling.cpu_linear import CpuLayoutLinear

    linear = CpuLayoutLinear(512, 512)
    linear.cpu_layouts = True
    x = torch.randn(rows, 512)
    assert 512 * 512 >= cpu_linear.PACKED_MIN_WEIGHT
    assert (rows * 512 * 512 >= cpu_linear.PACKED_MIN_MACS) == (rows == 37)
    with torch.no_grad():
        served = linear(x)
    copy = "_packed" if rows == 37 else "_by_column"
    if rows == 37 and not linear_kernels.packed_kernel_available():
        pytest.skip("this host's oneDNN refuses the packed linear in float32 (or VERL_TLT_NO_PACKED_KERNEL is set)")
    assert getattr(linear, copy) is not None  # the forward used the copy
    assert torch.allclose(served, torch.nn.functional.linear(x, linear.weight, linear.bias), atol=1e-5)
    linear(x).sum().backward()  # with autograd on, the parameter path runs and gets a gradient
    assert linear.weight.grad is not None
    with torch.no_grad():
        linear.weight.add_(1.0)  # an in-place update (optimizer step) must refresh the copy
        assert torch.allclose(linear(x), torch.nn.functional.linear(x, linear.weight, linear.bias), atol=1e-4)


def test_packed_products_run_on_few_padded_row_counts():
    from verl_tlt.modeling.linear_kernels import packed_rows

    sizes = [packed_rows(rows) for rows in range(1, 8193)]
    assert all(size >= rows and size <= max(8, 1.25 * rows) for rows, size in enumerate(sizes, start=1))
    assert sizes == sorted(sizes) and len(set(sizes)) <= 45  # each distinct size costs one kernel compilation


@pytest.mark.parametrize("kernels", ["measure", "linear", "by_column", "packed", "matrix_vector"])
def test_every_cpu_kernel_choice_decodes_the_same_tokens(varied_qwen2, kernels):
    from verl_tlt.modeling.linear_kernels import available_kernels

    if kernels == "packed" and "packed" not in available_kernels():
        pytest.skip("this host's oneDNN refuses the packed linear in float32 (or VERL_TLT_NO_PACKED_KERNEL is set)")
    path, _ = varied_qwen2
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [20]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    reference = RolloutEngine.from_pretrained(str(path), cpu_layouts=False).generate(prompts, params)
    engine = RolloutEngine.from_pretrained(str(path), cpu_layouts=True, cpu_kernels=kernels)
    assert engine.runner.kernel_plan is not None and (kernels == "measure") == (
        engine.runner.kernel_plan.forced is None
    )
    assert_same_outputs(engine.generate(prompts, params), reference, atol=1e-4)
    # Batch 1: single-row products, which matrix_vector serves.
    assert_same_outputs(engine.generate(prompts[:1], params), reference[:1], atol=1e-4)


def test_a_bad_cpu_kernels_value_names_the_choices(tiny_qwen2):
    path, _ = tiny_qwen2
    with pytest.raises(ValueError, match="cpu_kernels must be one of measure, thresholds"):
        RolloutEngine.from_pretrained(str(path), cpu_kernels="fastest")
