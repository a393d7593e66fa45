"""Hidden-state capture on the actor's forward: the longest responses within budget, exact hidden states, no
change to the forward, in verl's packed (remove-padding) and padded layouts."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_tlt.drafter.capture import CaptureWindows, choose_windows_for_capture
from verl_tlt.integrations.verl.hidden_capture import HiddenStateCapture, find_final_norm

VOCAB = 50
# (prompt length, response mask) per row; row 3's response has tool output (0s) inside, as in multi-turn.
ROWS = [
    (3, [1, 1, 1, 1]),
    (2, [1] * 9),
    (4, [1, 1]),
    (1, [1, 1, 0, 0, 1, 1]),
    (3, [1] * 9),
]
# Budget 30: responses 9 (row 1, 11 tokens), 9 (row 4, 12 tokens) and 6 (row 3, 7 tokens) fit exactly; rows 0 and
# 2 (shorter responses) no longer do.
BUDGET, CHOSEN = 30, [1, 3, 4]


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    return Qwen2ForCausalLM(config).eval()


def nested(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.nested_tensor(list(tensors), layout=torch.jagged)


def make_batch(rows=ROWS, seed: int = 1, sequences: list[torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """verl's no-padding batch: nested input_ids and a nested response_mask of each row's response suffix."""
    generator = torch.Generator().manual_seed(seed)
    if sequences is None:
        sequences = [torch.randint(3, VOCAB, (prompt + len(mask),), generator=generator) for prompt, mask in rows]
    masks = [torch.tensor(mask) for _, mask in rows]
    return {"input_ids": nested(sequences), "response_mask": nested(masks)}


class FakeEngine:
    """verl's training engine surface: `module` and forward_step on a micro-batch, in one of verl's layouts.

    packed: remove-padding, all tokens in one [1, N] row, positions restarting per sequence (a plain HF model then
    attends across sequences; the tests compare with what the model computed, kept in `seen`). packed_pad: the
    same plus a static pad after the tokens. padded: [B, L] right-padded rows with an attention mask.
    """

    def __init__(self, module: torch.nn.Module, layout: str = "packed"):
        self.module, self.layout = module, layout
        self.seen: list[torch.Tensor] = []  # the last hidden state of every forward
        self.seen_all: list[tuple[torch.Tensor, ...]] = []  # every layer's (transformers' hidden_states)

    def forward_step(self, micro_batch, loss_function=None, forward_only=True):
        sequences = list(micro_batch["input_ids"].unbind())
        with torch.no_grad():
            if self.layout in ("packed", "packed_pad"):
                input_ids = micro_batch["input_ids"].values()
                positions = torch.cat([torch.arange(len(s)) for s in sequences])
                if self.layout == "packed_pad":
                    input_ids = torch.cat([input_ids, torch.zeros(5, dtype=input_ids.dtype)])
                    positions = torch.cat([positions, torch.arange(5)])
                out = self.module(
                    input_ids=input_ids.unsqueeze(0), position_ids=positions.unsqueeze(0), output_hidden_states=True
                )
            else:
                width = max(len(s) for s in sequences)
                input_ids = torch.zeros(len(sequences), width, dtype=torch.long)
                attention_mask = torch.zeros(len(sequences), width, dtype=torch.long)
                for i, s in enumerate(sequences):
                    input_ids[i, : len(s)], attention_mask[i, : len(s)] = s, 1
                out = self.module(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        self.seen.append(out.hidden_states[-1])
        self.seen_all.append(out.hidden_states)
        return {"logits": out.logits, "loss_function": loss_function, "forward_only": forward_only}


def micro_batches(data, size: int) -> list[dict[str, torch.Tensor]]:
    ids, masks = data["input_ids"].unbind(), data["response_mask"].unbind()
    return [
        {"input_ids": nested(ids[i : i + size]), "response_mask": nested(masks[i : i + size])}
        for i in range(0, len(ids), size)
    ]


def infer_batch_for(engine: FakeEngine, micro_batch_size: int):
    """A TrainingWorker.infer_batch: split the batch into micro-batches, run engine.forward_step on each."""

    def infer_batch(data):
        return [
            engine.forward_step(mb, loss_function=None, forward_only=True)
            for mb in micro_batches(data, micro_batch_size)
        ]

    return infer_batch


def install(model, layout="packed", micro_batch_size=2, **kwargs):
    engine = FakeEngine(model, layout)
    capture = HiddenStateCapture(engine, **kwargs)
    return engine, capture, capture.wrap(infer_batch_for(engine, micro_batch_size))


def expected_mask(row: int, rows=ROWS) -> list[bool]:
    prompt, mask = rows[row]
    return [False] * prompt + [bool(m) for m in mask]


def standalone_hidden(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens.unsqueeze(0), output_hidden_states=True).hidden_states[-1][0]


def seen_rows(engine: FakeEngine, data, micro_batch_size: int) -> dict[int, torch.Tensor]:
    """Row -> the hidden states the model computed for it (packed layout), from the engine's record."""
    out, row = {}, 0
    for hidden, mb in zip(engine.seen, micro_batches(data, micro_batch_size), strict=True):
        offsets = mb["input_ids"].offsets().tolist()
        for a, b in zip(offsets, offsets[1:], strict=False):
            out[row] = hidden[0, a:b]
            row += 1
    return out


# ----- what is captured ------------------------------------------------------------------------------------------


def planned(data, budget: int, step: int, windows: CaptureWindows | None = None) -> list[tuple[int, int, int]]:
    """The windows the capture must take: the planner's choice (tests/drafter/test_capture.py tests the planner)."""
    responses = data["response_mask"].offsets().diff().tolist()
    totals = data["input_ids"].offsets().diff().tolist()
    return choose_windows_for_capture(responses, totals, budget, windows or CaptureWindows(), seed=step)


@pytest.mark.parametrize("layout", ["packed", "packed_pad"])
def test_packed_layout_captures_the_planned_windows_with_the_models_last_hidden_state(model, layout):
    engine, capture, infer_batch = install(model, layout, micro_batch_size=2)
    data = make_batch()
    capture.arm(step=7, token_budget=BUDGET)
    infer_batch(data)
    samples, stats = capture.pop()

    windows = planned(data, BUDGET, step=7)
    assert len(windows) >= 2
    sequences = data["input_ids"].unbind()
    expected_hidden = seen_rows(engine, data, 2)
    assert len(samples) == len(windows)
    for sample, (row, start, end) in zip(samples, windows, strict=True):
        assert sample.token_ids.tolist() == sequences[row][start:end].tolist()
        assert sample.step == 7 and sample.token_ids.dtype == torch.long
        assert torch.equal(sample.hidden_states, expected_hidden[row][start:end])
        assert sample.response_mask.tolist() == expected_mask(row)[start:end]
    tokens = sum(end - start for _, start, end in windows)
    assert stats["samples"] == len(windows) and stats["tokens"] == tokens <= BUDGET and stats["seconds"] > 0.0


def test_armed_with_feature_layers_the_samples_carry_the_final_state_then_those_layers_inputs(model):
    """EAGLE-3's capture: [final | the input of each named decoder layer], which is transformers' hidden_states[i]."""
    engine, capture, infer_batch = install(model, "packed", micro_batch_size=2)
    data = make_batch()
    capture.arm(step=3, token_budget=BUDGET, feature_layers=(0, 1))
    infer_batch(data)
    samples, _ = capture.pop()
    windows = planned(data, BUDGET, step=3)
    assert len(samples) == len(windows) >= 2
    rows: dict[int, torch.Tensor] = {}
    row = 0
    for states, mb in zip(engine.seen_all, micro_batches(data, 2), strict=True):
        offsets = mb["input_ids"].offsets().tolist()
        for a, b in zip(offsets, offsets[1:], strict=False):
            rows[row] = torch.cat([states[-1][0, a:b], states[0][0, a:b], states[1][0, a:b]], dim=-1)
            row += 1
    for sample, (row, start, end) in zip(samples, windows, strict=True):
        assert sample.hidden_states.shape[-1] == 3 * model.config.hidden_size
        assert torch.equal(sample.hidden_states, rows[row][start:end])
    capture.arm(step=4, token_budget=BUDGET)  # armed without them again: the final state alone
    infer_batch(data)
    assert capture.pop()[0][0].hidden_states.shape[-1] == model.config.hidden_size
    capture.arm(step=5, token_budget=BUDGET, feature_layers=(1, 7))  # a layer the model lacks: skipped, no crash
    infer_batch(data)
    assert capture.pop()[0] == []


def test_one_sequence_per_micro_batch_captures_exactly_the_sequences_own_hidden_states(model):
    _, capture, infer_batch = install(model, "packed", micro_batch_size=1)
    data = make_batch()
    capture.arm(step=1, token_budget=BUDGET)
    infer_batch(data)
    samples, _ = capture.pop()
    sequences = data["input_ids"].unbind()
    windows = planned(data, BUDGET, step=1)
    assert len(samples) == len(windows) > 0
    for sample, (row, start, end) in zip(samples, windows, strict=True):
        # The final norm's output is what the LM head reads: transformers' hidden_states[-1] for Qwen2.
        reference = standalone_hidden(model, sequences[row])[start:end]
        assert torch.allclose(sample.hidden_states, reference, atol=1e-5)
        logits = model(sequences[row][None]).logits[0, start:end]
        assert torch.allclose(model.lm_head(sample.hidden_states), logits, atol=1e-5)


def test_padded_layout_drops_the_padding_and_keeps_each_rows_hidden_states(model):
    _, capture, infer_batch = install(model, "padded", micro_batch_size=3)
    data = make_batch()
    capture.arm(step=2, token_budget=BUDGET)
    infer_batch(data)
    samples, _ = capture.pop()
    sequences = data["input_ids"].unbind()
    windows = planned(data, BUDGET, step=2)
    assert [s.token_ids.tolist() for s in samples] == [sequences[row][a:b].tolist() for row, a, b in windows]
    for sample, (row, start, end) in zip(samples, windows, strict=True):
        assert sample.hidden_states.shape == (end - start, 32)
        assert torch.allclose(sample.hidden_states, standalone_hidden(model, sequences[row])[start:end], atol=1e-5)
        assert sample.response_mask.tolist() == expected_mask(row)[start:end]


def test_windows_reach_late_positions_of_a_response_with_their_exact_hidden_states(model):
    """Small windows and a small budget: windows inside responses are captured, not only prefixes."""
    engine, capture, infer_batch = install(model, "packed", micro_batch_size=2)
    data = make_batch()
    windows = CaptureWindows(window_tokens=3, tail_weight=8.0, sd_batch=2)
    capture.arm(step=5, token_budget=20, windows=windows)
    infer_batch(data)
    samples, _ = capture.pop()
    chosen = planned(data, 20, step=5, windows=windows)
    assert any(start > 0 for _, start, _ in chosen) and len(samples) == len(chosen)  # a window inside a response
    expected_hidden = seen_rows(engine, data, 2)
    for sample, (row, start, end) in zip(samples, chosen, strict=True):
        assert torch.equal(sample.hidden_states, expected_hidden[row][start:end])
        assert sample.num_loss_pairs == sum(expected_mask(row)[start + 1 : end])


def test_the_forward_and_its_return_value_are_unchanged(model):
    engine = FakeEngine(model, "packed")
    original = engine.forward_step
    capture = HiddenStateCapture(engine)
    infer_batch = capture.wrap(infer_batch_for(engine, 2))
    data = make_batch()
    capture.arm(step=0, token_budget=BUDGET)
    outputs = infer_batch(data)
    assert len(capture.samples) == 3
    reference = [original(mb, loss_function=None, forward_only=True) for mb in micro_batches(data, 2)]
    for got, want in zip(outputs, reference, strict=True):
        assert torch.equal(got["logits"], want["logits"])
        assert got["forward_only"] is True and got["loss_function"] is None
    assert len(model.model.norm._forward_hooks) == 0  # the hook lives only during a capturing forward


def test_nothing_is_captured_when_not_armed_and_arming_covers_one_batch_only(model):
    engine, capture, infer_batch = install(model)
    data = make_batch()
    infer_batch(data)
    assert capture.pop()[0] == []
    capture.arm(step=3, token_budget=BUDGET)
    infer_batch(data)
    infer_batch(data)  # the next batch (e.g. another mini-batch) is not captured again
    assert len(capture.pop()[0]) == 3
    assert len(engine.seen) == 9


def test_a_budget_that_fits_no_sequence_captures_nothing(model):
    _, capture, infer_batch = install(model)
    capture.arm(step=3, token_budget=5)  # the shortest sequence has 6 tokens
    infer_batch(make_batch())
    assert capture.pop()[0] == []


def test_each_data_parallel_rank_captures_its_share_of_the_budget(model):
    _, capture, infer_batch = install(model, dp_size=2)
    capture.arm(step=0, token_budget=2 * BUDGET)
    data = make_batch()
    infer_batch(data)
    # The same windows as one rank with BUDGET (and an sd_batch above the 5 rows either way).
    assert [s.num_tokens for s in capture.pop()[0]] == [end - start for _, start, end in planned(data, BUDGET, 0)]


def test_ulysses_without_a_group_to_gather_over_turns_capture_off(model):
    engine = FakeEngine(model)
    engine.use_ulysses_sp = True
    capture = HiddenStateCapture(engine)
    infer_batch = capture.wrap(infer_batch_for(engine, 2))
    capture.arm(step=0, token_budget=BUDGET)
    infer_batch(make_batch())
    assert not capture.enabled and capture.pop()[0] == []


def test_sp2_capture_over_two_gloo_processes_equals_sp1(tmp_path):
    """Two processes split each packed row as Ulysses does; the output rank's samples equal an unsplit capture."""
    import torch.multiprocessing as mp

    from tests.integrations.verl import sp_capture_probe

    expected = sp_capture_probe.capture(sp_rank=0, sp_size=1, group=None)
    context = mp.get_context("spawn")
    processes = [context.Process(target=sp_capture_probe.run_rank, args=(rank, 2, str(tmp_path))) for rank in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0, f"SP rank process exited with {process.exitcode}"
    kept = torch.load(tmp_path / "rank0.pt", weights_only=False)  # written by the test's own processes
    assert torch.load(tmp_path / "rank1.pt", weights_only=False) == []  # the other rank gathered, and kept nothing
    assert len(kept) == len(expected) > 0
    for got, want in zip(kept, expected, strict=True):
        assert torch.equal(got.token_ids, want.token_ids) and torch.equal(got.response_mask, want.response_mask)
        assert torch.equal(got.hidden_states, want.hidden_states)


def test_duplicate_sequences_are_captured_as_often_as_they_were_chosen(model):
    generator = torch.Generator().manual_seed(3)
    a, b = torch.randint(3, VOCAB, (8,), generator=generator), torch.randint(3, VOCAB, (6,), generator=generator)
    rows = [(2, [1] * 6), (2, [1] * 4), (2, [1] * 6)]
    data = make_batch(rows, sequences=[a, b, a.clone()])  # GRPO: the same response twice in a group

    _, capture, infer_batch = install(model, micro_batch_size=1)
    capture.arm(step=0, token_budget=22)  # everything: both copies of a (8 + 8) and b (6)
    infer_batch(data)
    samples = capture.pop()[0]
    assert [s.token_ids.tolist() for s in samples] == [a.tolist(), b.tolist(), a.tolist()]


def test_pop_hands_over_the_samples_and_resets(model):
    _, capture, infer_batch = install(model)
    capture.arm(step=0, token_budget=BUDGET)
    infer_batch(make_batch())
    samples, stats = capture.pop()
    assert len(samples) == 3 and stats["seconds"] > 0.0
    assert capture.pop() == ([], {"seconds": 0.0, "samples": 0.0, "tokens": 0.0})


# ----- robustness ------------------------------------------------------------------------------------------------


def test_a_batch_without_the_nested_layout_is_skipped(model):
    _, capture, _ = install(model)
    ran = capture.wrap(lambda data: "ran")
    capture.arm(step=0, token_budget=BUDGET)
    assert ran({"input_ids": torch.ones(2, 4, dtype=torch.long), "response_mask": torch.ones(2, 2)}) == "ran"
    assert capture.pop()[0] == [] and capture._armed is None


def test_an_unexpected_hidden_shape_is_skipped_not_raised(model):
    class OddEngine(FakeEngine):
        def forward_step(self, micro_batch, loss_function=None, forward_only=True):
            result = super().forward_step(micro_batch, loss_function, forward_only)
            self.module.model.norm(torch.zeros(3, 1, 32))  # the norm's last output: [3, 1, H] for 2 sequences
            return result

    engine = OddEngine(model)
    capture = HiddenStateCapture(engine)
    capture.arm(step=0, token_budget=BUDGET)
    outputs = capture.wrap(infer_batch_for(engine, 2))(make_batch())
    assert len(outputs) == 3 and capture.pop()[0] == []


def test_a_failing_forward_propagates_and_removes_the_hook(model):
    engine = FakeEngine(model)
    capture = HiddenStateCapture(engine)

    def boom(micro_batch, *args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    capture._forward_step = boom
    capture.arm(step=0, token_budget=BUDGET)
    with pytest.raises(RuntimeError, match="out of memory"):
        capture.wrap(infer_batch_for(engine, 2))(make_batch())
    assert len(model.model.norm._forward_hooks) == 0 and capture._armed is None


def test_find_final_norm_finds_qwen2s_norm_also_inside_an_fsdp_wrapper(model):
    assert find_final_norm(model) is model.model.norm

    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self._fsdp_wrapped_module = inner

    assert find_final_norm(Wrapper(model)) is model.model.norm


def test_find_final_norm_explains_an_unsupported_module():
    with pytest.raises(ValueError, match="Cannot find the final norm of Linear"):
        find_final_norm(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="Cannot find the final norm"):
        HiddenStateCapture(FakeEngine(torch.nn.Sequential(torch.nn.Linear(4, 4))))


# ----- teacher labels from the forward's own logits -------------------------------------------------------------


@pytest.mark.parametrize("layout", ["packed", "packed_pad", "padded"])
def test_armed_with_a_top_k_the_samples_carry_the_labels_of_the_models_own_logits(model, layout):
    from verl_tlt.drafter.teacher import teacher_labels

    _, capture, infer_batch = install(model, layout, micro_batch_size=2)
    capture.arm(step=3, token_budget=BUDGET, teacher_top_k=8)
    infer_batch(make_batch())
    samples, _ = capture.pop()
    assert len(samples) == 3
    for sample in samples:
        want = teacher_labels(sample.hidden_states, model.lm_head.weight, 8)  # what a drafter worker would compute
        assert sample.teacher is not None and sample.teacher.top_k == 8
        assert torch.equal(sample.teacher.token_ids, want.token_ids)
        assert torch.allclose(sample.teacher.log_probs, want.log_probs, atol=1e-5)
        assert torch.allclose(sample.teacher.rest_mass, want.rest_mass, atol=1e-5)
    assert len(model.lm_head._forward_hooks) == 0


def test_labels_are_taken_before_the_trainer_scales_the_logits_in_place(model):
    """verl divides the logits by the temperature in place after the forward: the labels must be the raw ones."""
    from verl_tlt.drafter.teacher import teacher_labels

    engine = FakeEngine(model, "packed")
    forward_step = engine.forward_step

    def scaling_forward_step(micro_batch, **kwargs):
        out = forward_step(micro_batch, **kwargs)
        out["logits"].div_(0.1)
        return out

    engine.forward_step = scaling_forward_step
    capture = HiddenStateCapture(engine)
    infer_batch = capture.wrap(infer_batch_for(engine, 2))
    capture.arm(step=0, token_budget=BUDGET, teacher_top_k=4)
    infer_batch(make_batch())
    for sample in capture.pop()[0]:
        want = teacher_labels(sample.hidden_states, model.lm_head.weight, 4)
        assert torch.allclose(sample.teacher.log_probs, want.log_probs, atol=1e-5)


def test_without_a_top_k_the_workers_label(model):
    _, capture, infer_batch = install(model, "packed", micro_batch_size=2)
    capture.arm(step=0, token_budget=BUDGET)
    infer_batch(make_batch())
    assert all(sample.teacher is None for sample in capture.pop()[0])
