"""`verl-tlt bench spot`: a drafter worker's spot-training cycle on a training device, at a target's shape.

What placing the drafter on the drained replica's GPU (`integrations.control.placement`) costs and buys, measured
with the worker's own code (`drafter.spot.SpotTrainer`) on random weights (only sizes matter for cost). The target's
embedding, LM head and one layer are built in host memory, as a worker holds them; captured samples are random
token ids and unit-scale hidden states in SAMPLE_TOKENS-token samples, labelled once on the device. Per train depth
(`--depths`):
- onload and offload: the burst's move of drafter, optimizer moments and shared head onto the device and back;
- trained tokens/s and peak device memory over `rounds` optimizer steps of `--tokens` pairs (after one untimed step);
- stop latency: from `stop()`, half a step into an open-ended burst, to the drafter back in host memory (the rest of
  the step in flight, then the offload), and what is left on the device afterwards (nothing of the trainer's; the
  bytes the allocator still holds);
then, once: the per-step score's cost on `--eval-tokens` tokens (online and frozen drafter, on the device); the loss
of one batch under bf16 autocast against fp32 (their relative difference); and, on CUDA, a drafter forward captured
in a CUDA graph, replayed after the drafter's weights were copied in place (what vLLM's loads do to its captured
drafter) against the eager forward with those weights, and after a copy that swaps tensors instead (the control:
the graph still reads the old ones). Writes JSON; on a CPU at the toy shape it runs in seconds (the tests do).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from verl_tlt.bench.drafter_train_bench import SAMPLE_TOKENS, SHAPES, PeakMemory, random_samples
from verl_tlt.bench.engine_bench import BenchModel, synchronizer
from verl_tlt.bench.host import device_info, host_info
from verl_tlt.config import DrafterConfig
from verl_tlt.files import write_json
from verl_tlt.progress import Progress

DEFAULT_TOKENS = 4096  # tlt.drafter.max_tokens_per_batch's default
DEFAULT_EVAL_TOKENS = 16384  # tlt.drafter.capture_tokens' default: one step's captures


def labelled_on(samples: list, head: torch.Tensor, top_k: int, device: torch.device) -> list:
    """`samples` with the target's sparse labels, computed on `device` (as the capture hook does on the actor's),
    kept in host memory."""
    from verl_tlt.drafter.teacher import teacher_labels

    weight = head.to(device)
    labelled = [
        sample.labelled(teacher_labels(sample.hidden_states.to(device), weight, top_k).to("cpu")) for sample in samples
    ]
    del weight
    return labelled


def _burst(spot, max_steps: int | None, sync):
    """Run a burst to its end (max_steps) and stop it; its report."""
    assert spot.start(max_steps=max_steps), "the burst did not start"
    while spot.is_running:
        time.sleep(0.001)
    report = spot.stop()
    sync()
    return report


def measure_depth(target, shape: BenchModel, samples: list, depth: int, tokens: int, rounds: int, device) -> dict:
    """One train depth's cycle: onload, timed steps, offload, then an open-ended burst stopped mid-way."""
    from verl_tlt.drafter.model import EagleDrafterModel
    from verl_tlt.drafter.spot import SpotTrainer

    sync = synchronizer(device)
    config = dataclasses.replace(DrafterConfig(), max_tokens_per_batch=tokens, train_depth=depth)
    torch.manual_seed(0)
    spot = SpotTrainer(EagleDrafterModel.from_target(target), config, device=device)
    spot.add_samples(samples)
    _burst(spot, 1, sync)  # untimed: kernels, the allocator, the draft head's rows
    memory = PeakMemory(device)
    memory.start()
    report = _burst(spot, rounds, sync)
    peak = memory.stop()
    moves = dict(spot.last_offload)
    # Stop latency: an open-ended burst, stopped half a step after its second step ended (a stop lands inside a step:
    # it waits for that step, then the offload).
    steps_before = spot.trainer.global_step
    assert spot.start(), "the burst did not start"
    while spot.trainer.global_step < steps_before + 2 and spot.is_running:
        time.sleep(0.001)
    time.sleep(0.5 * report.seconds / max(report.steps, 1))
    begin = time.perf_counter()
    spot.stop()
    sync()
    stop_latency = time.perf_counter() - begin
    left = spot.trainer.tensors_off("cpu")
    row = {
        "shape": shape.name,
        "train_depth": depth,
        "tokens_per_step": report.tokens / max(report.steps, 1),  # trained pairs: a sample of T tokens has T - 1
        "tokens_per_s": report.tokens / report.seconds if report.seconds else 0.0,
        "step_s": report.seconds / max(report.steps, 1),
        "peak_device_gib": peak / 2**30,
        "onload_s": moves.get("onload_s", 0.0),
        "offload_s": moves.get("offload_s", 0.0),
        "stop_latency_s": stop_latency,
        "stop_offload_s": spot.last_offload.get("offload_s", 0.0),
        "tensors_left_on_device": len(left),
        "autocast": str(spot.trainer.autocast).removeprefix("torch.") if spot.trainer.autocast else "fp32",
    }
    if device.type == "cuda":
        row["device_allocated_after_offload_mib"] = torch.cuda.memory_allocated(device) / 2**20
    return row


def measure_eval_and_precision(target, samples: list, eval_samples: list, tokens: int, device) -> dict:
    """The per-step score's seconds on the device, and one batch's loss in bf16 autocast against fp32."""
    from verl_tlt.drafter.data import DrafterDataBuffer, pack
    from verl_tlt.drafter.evaluate import evaluate_within
    from verl_tlt.drafter.model import EagleDrafterModel
    from verl_tlt.drafter.trainer import DrafterTrainer

    sync = synchronizer(device)
    config = dataclasses.replace(DrafterConfig(), max_tokens_per_batch=tokens)
    trainer = DrafterTrainer(EagleDrafterModel.from_target(target), DrafterDataBuffer(max_tokens=2), config)
    trainer.add_samples(samples)
    trainer.apply_draft_vocab()
    trainer.to_device(device)
    frozen = EagleDrafterModel.from_target(trainer.model.target)
    frozen.load_state_dict(trainer.model.state_dict())
    frozen.to(device)
    sync()
    begin = time.perf_counter()
    scores, scored = evaluate_within({"online": trainer.model, "frozen": frozen}, eval_samples, tokens, 0)
    sync()
    eval_s = time.perf_counter() - begin
    batch = pack(samples[: max(1, tokens // SAMPLE_TOKENS)]).to(device, torch.float32)
    with torch.no_grad():
        fp32 = _loss(trainer, batch, None)
        bf16 = _loss(trainer, batch, torch.bfloat16)
    trainer.to_device("cpu")
    del frozen
    return {
        "eval_tokens": sum(s.num_tokens for s in eval_samples[:scored]),
        "eval_s": eval_s,
        "eval_online_num_pairs": scores["online"].get("num_pairs", 0.0),
        "loss_fp32": fp32,
        "loss_bf16": bf16,
        "loss_bf16_rel_diff": abs(bf16 - fp32) / abs(fp32) if fp32 else 0.0,
    }


def _loss(trainer, batch, autocast: torch.dtype | None) -> float:
    device = batch.input_hidden.device
    with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        losses = trainer._losses(batch, batch.input_hidden)
    return float(trainer.weighted_loss(losses))


def measure_graph_reload(target, samples: list, device: torch.device) -> dict:
    """A drafter forward captured in a CUDA graph, replayed after in-place weight copies, against eager."""
    if device.type != "cuda":
        return {"graph_reload": "skipped: CUDA graphs need CUDA"}
    from verl_tlt.drafter.data import pack
    from verl_tlt.drafter.model import EagleDrafterModel
    from verl_tlt.drafter.trainer import drafter_forward

    try:
        model = EagleDrafterModel.from_target(target).to(device)
        model.target.to(device)
        batch = pack(samples[:1]).to(device, torch.float32)
        with torch.no_grad():
            drafter_forward(model, batch, batch.input_hidden)  # warm-up on a side stream, as capture wants
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = drafter_forward(model, batch, batch.input_hidden)
            fresh = {name: torch.randn_like(p) * 0.02 for name, p in model.named_parameters()}
            for name, param in model.named_parameters():
                param.copy_(fresh[name])  # in place, as the vLLM worker extension loads a new drafter
            graph.replay()
            eager = drafter_forward(model, batch, batch.input_hidden)
            in_place_equal = bool(torch.equal(captured, eager))
            swapped = {name: torch.randn_like(p) * 0.02 for name, p in model.named_parameters()}
            for name, param in model.named_parameters():
                param.data = swapped[name]  # a new tensor: the graph keeps reading the old addresses
            graph.replay()
            eager = drafter_forward(model, batch, batch.input_hidden)
            swapped_equal = bool(torch.equal(captured, eager))
        model.target.to("cpu")
        return {
            "graph_replay_equals_eager_after_in_place_copy": in_place_equal,
            "graph_sees_swapped_tensors": swapped_equal,
        }
    except Exception as error:  # a GPU check reports what failed rather than losing the other numbers
        return {"graph_reload": f"failed: {type(error).__name__}: {error}"}


def run(
    json_path: str | None,
    shape_name: str,
    *,
    device: str = "cpu",
    tokens: int = DEFAULT_TOKENS,
    eval_tokens: int = DEFAULT_EVAL_TOKENS,
    depths: tuple[int, ...] = (1, 3),
    rounds: int = 3,
) -> dict:
    from verl_tlt.bench.random_target import build_target, model_spec

    torch_device = torch.device(device)
    shape = SHAPES[shape_name]
    progress = Progress("bench spot", len(depths) + 3, unit="parts")
    # Host memory, as a drafter worker holds its target's parts between bursts.
    target = build_target(model_spec(shape), "cpu", torch.float32, seed=0).requires_grad_(False)
    top_k = DrafterConfig().teacher_top_k
    samples = labelled_on(
        random_samples(shape, tokens * (rounds + 4), seed=1, pairs=False), target.lm_head.weight, top_k, torch_device
    )
    eval_samples = labelled_on(
        random_samples(shape, eval_tokens, seed=2, pairs=False), target.lm_head.weight, top_k, torch_device
    )
    progress.advance(extra="samples labelled")
    rows = []
    for depth in depths:
        rows.append(measure_depth(target, shape, samples, depth, tokens, rounds, torch_device))
        print(_row_line(rows[-1]), flush=True)
        progress.advance(extra=f"depth {depth}")
    once = measure_eval_and_precision(target, samples, eval_samples, tokens, torch_device)
    progress.advance(extra="score and precision")
    once.update(measure_graph_reload(target, samples, torch_device))
    progress.advance(extra="graph reload")
    result = {
        "benchmark": "spot",
        **host_info(),
        **device_info(torch_device),
        "shape": shape.name,
        "rounds": rounds,
        "rows": rows,
        **once,
    }
    print(
        f"score of {once['eval_tokens']} tokens (online + frozen): {once['eval_s']:.2f} s; loss bf16 vs fp32: "
        f"{once['loss_bf16_rel_diff']:.2e} relative; graph: "
        f"{once.get('graph_replay_equals_eager_after_in_place_copy', once.get('graph_reload'))}",
        flush=True,
    )
    if json_path:
        write_json(json_path, result)
    return result


def _row_line(row: dict) -> str:
    return (
        f"{row['shape']:>12} depth {row['train_depth']}: {row['tokens_per_s']:9.0f} tokens/s, peak "
        f"{row['peak_device_gib']:.2f} GiB, onload {row['onload_s']:.3f} s, offload {row['offload_s']:.3f} s, stop "
        f"{row['stop_latency_s']:.3f} s, {row['tensors_left_on_device']} tensors left, {row['autocast']}"
    )
