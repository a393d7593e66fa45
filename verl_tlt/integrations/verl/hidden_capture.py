"""Hidden-state capture on the actor's forward: what the drafter learns from, at the cost of a copy.

verl computes the actor's log-probs over every finished rollout (`compute_log_prob`); that forward already
produces the target's last-layer hidden states, the EAGLE drafter's training input. `HiddenStateCapture` wraps
one training engine: when armed for a step, the next batch that goes through `infer_batch` (or, when verl skips
that pass, `train_mini_batch`) is planned (which windows of which responses to keep within this rank's share of
the token budget, weighted toward the positions the rollout decoded with speculation on: `drafter.capture`) and,
for each micro-batch, a forward hook on the model's final norm picks the kept windows' hidden states and copies
them to CPU as `DrafterSample`s. When armed with a teacher top-k, a hook on the LM head also turns
the logits the forward computes anyway into the samples' sparse teacher labels (`drafter.teacher`), once, here,
instead of every drafter worker running the target's head over them again (where fused kernels skip the head
module, the workers still label). Nothing else changes: the forward's inputs and outputs, and so the log-probs, are
untouched.

Layouts: verl's FSDP engine runs packed sequences ([1, N] with remove-padding) or padded rows ([B, L]); both
are handled. With Ulysses sequence parallelism (packed only) each rank of a sequence-parallel group computes a
contiguous slice of the padded [1, N] row: the hook gathers the slices over the group (every rank of it runs the
same micro-batches, so all reach the same gathers), and one rank of the group, verl's output rank, keeps the samples.
Labels then come from the drafter workers (gathering [N, vocabulary] logits would cost more than labelling there).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from verl_tlt.drafter.capture import CaptureWindows, choose_windows_for_capture, samples_from_packed
from verl_tlt.drafter.data import DrafterSample
from verl_tlt.drafter.teacher import TeacherLabels, labels_from_logits

logger = logging.getLogger(__name__)


def _module_at(module: torch.nn.Module, paths: tuple[str, ...], kind: type) -> torch.nn.Module | None:
    """The first of `paths` (dotted attribute paths) that leads to a `kind` inside `module` (or its FSDP wrapper)."""
    inner = getattr(module, "_fsdp_wrapped_module", module)
    for path in paths:
        node = inner
        for part in path.split("."):
            node = getattr(node, part, None)
            if node is None:
                break
        if isinstance(node, kind):
            return node
    return None


def find_final_norm(module: torch.nn.Module) -> torch.nn.Module:
    """The final norm of a transformers decoder-only model (its output is what the LM head reads)."""
    paths = ("model.norm", "model.language_model.norm", "transformer.ln_f", "model.decoder.final_layer_norm")
    norm = _module_at(module, paths, torch.nn.Module)
    if norm is None:
        inner = getattr(module, "_fsdp_wrapped_module", module)
        raise ValueError(
            f"Cannot find the final norm of {type(inner).__name__} (looked for model.norm and similar): hidden-state "
            "capture for the drafter supports transformers decoder-only models such as Qwen2/Qwen3/Llama."
        )
    return norm


def find_decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a transformers decoder-only model, in order (empty if not found: no EAGLE-3 capture)."""
    paths = ("model.layers", "model.language_model.layers", "transformer.h", "model.decoder.layers")
    layers = _module_at(module, paths, torch.nn.ModuleList)
    return list(layers) if layers is not None else []


def find_lm_head(module: torch.nn.Module) -> torch.nn.Module | None:
    """The LM head of a transformers causal LM (tied or not), or None."""
    inner = getattr(module, "_fsdp_wrapped_module", module)
    get_head = getattr(inner, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else getattr(inner, "lm_head", None)
    return head if isinstance(head, torch.nn.Module) else None


def _sequence_key(tokens: torch.Tensor) -> int:
    return hash(tuple(tokens.tolist()))


class HiddenStateCapture:
    def __init__(self, engine: Any, dp_size: int = 1, sp_group: Any = None, keeps: bool = True):
        """dp_size: data-parallel ranks the step's token budget is split over; sp_group: the Ulysses
        sequence-parallel process group when verl splits sequences (None without SP); keeps: whether this rank keeps
        what it captures (one rank per sequence-parallel group)."""
        self.engine, self.dp_size = engine, max(1, dp_size)
        self.norm = find_final_norm(engine.module)
        self.head = find_lm_head(engine.module)
        self.sp_group, self.keeps = sp_group, keeps
        self.enabled = True
        if getattr(engine, "use_ulysses_sp", False) and sp_group is None:
            self.enabled = False
            logger.warning(
                "TLT hidden-state capture is off: Ulysses sequence parallelism splits sequences and the engine has no "
                "sequence-parallel group to gather them over (ulysses_parallel_group); the drafter is not trained"
            )
        self._forward_step = engine.forward_step
        engine.forward_step = self._capturing_forward_step
        self._armed: tuple[int, int] | None = None  # (RL step, token budget of this rank)
        self._teacher_top_k = 0  # label at the LM head with this top-k (0: the workers label)
        self._feature_layers: tuple[int, ...] = ()  # EAGLE-3's layers, captured after the final state
        self.layers = find_decoder_layers(engine.module)
        self._windows = CaptureWindows()
        # sequence key -> the windows (start, end) to keep of each copy still to capture
        self._wanted: dict[int, list[list[tuple[int, int]]]] = {}
        self.samples: list[DrafterSample] = []
        self.seconds = 0.0

    def arm(
        self,
        step: int,
        token_budget: int,
        teacher_top_k: int = 0,
        windows: CaptureWindows | None = None,
        feature_layers: tuple[int, ...] = (),
    ) -> None:
        """Capture from the next planned batch (this rank's share of `token_budget` tokens); teacher_top_k > 0 also
        labels the captured positions from the forward's own logits. windows: how the budget is spent, its
        `sd_batch` for the whole batch (this rank sees 1/dp_size of the rows, so its share of that).
        feature_layers: residual-stream states (the inputs of those decoder layers) captured after the final one,
        for an EAGLE-3 drafter: samples then hold [final | layers] per token."""
        if self.enabled:
            self._armed = (step, max(1, token_budget // self.dp_size))
            self._teacher_top_k = teacher_top_k
            self._feature_layers = tuple(feature_layers)
            windows = windows or CaptureWindows()
            self._windows = dataclasses.replace(windows, sd_batch=max(1, round(windows.sd_batch / self.dp_size)))
            self._wanted = {}

    def wrap(self, method: Callable) -> Callable:
        """Wrap a TrainingWorker method taking the whole batch (infer_batch/train_mini_batch): plan, then run."""

        def planned(data, *args, **kwargs):
            if self._armed is not None and not self._wanted:
                self._plan(data)
            try:
                return method(data, *args, **kwargs)
            finally:
                self._armed, self._wanted = None, {}

        return planned

    def pop(self) -> tuple[list[DrafterSample], dict[str, float]]:
        samples, self.samples = self.samples, []
        stats = {
            "seconds": self.seconds,
            "samples": float(len(samples)),
            "tokens": float(sum(s.num_tokens for s in samples)),
        }
        self.seconds = 0.0
        return samples, stats

    # ----- internals -------------------------------------------------------------------------------------------

    def _plan(self, data) -> None:
        begin = time.perf_counter()
        input_ids, response_mask = data["input_ids"], data["response_mask"]
        if not (getattr(input_ids, "is_nested", False) and getattr(response_mask, "is_nested", False)):
            logger.warning("TLT capture expects verl's nested (no-padding) batch layout; skipping this step")
            return
        offsets = input_ids.offsets().tolist()
        totals = input_ids.offsets().diff().tolist()
        responses = response_mask.offsets().diff().tolist()
        step, budget = self._armed
        chosen = choose_windows_for_capture(responses, totals, budget, self._windows, seed=step)
        by_row: dict[int, list[tuple[int, int]]] = {}
        for row, start, end in chosen:
            by_row.setdefault(row, []).append((start, end))
        values = input_ids.values()
        for row, windows in by_row.items():
            key = _sequence_key(values[offsets[row] : offsets[row + 1]])
            self._wanted.setdefault(key, []).append(windows)
        self.seconds += time.perf_counter() - begin

    def _capturing_forward_step(self, micro_batch, *args, **kwargs):
        if self._armed is None or not self._wanted:
            return self._forward_step(micro_batch, *args, **kwargs)
        chosen = self._chosen_rows(micro_batch)
        if not chosen:  # nothing of this micro-batch was chosen: copy nothing
            return self._forward_step(micro_batch, *args, **kwargs)
        captured: dict[str, Any] = {}

        def hidden_hook(module, inputs, output):
            hidden = (output[0] if isinstance(output, tuple) else output).detach()
            captured["hidden"] = self._gathered(hidden) if self.sp_group is not None else hidden

        def logits_hook(module, inputs, output):
            # Labelled right away: verl may scale the logits in place (temperature) once the forward returns.
            begin = time.perf_counter()
            try:
                captured["labels"] = self._labels(micro_batch, chosen, output.detach())
            except Exception:  # capture must never break the RL step; the workers label instead
                logger.exception("TLT capture could not label a micro-batch at the LM head; the workers will")
            self.seconds += time.perf_counter() - begin

        def layer_input_hook(layer_id: int):
            def hook(module, args, kwargs):
                hidden = kwargs.get("hidden_states", args[0] if args else None)
                hidden = hidden[0] if isinstance(hidden, tuple) else hidden
                if isinstance(hidden, torch.Tensor):
                    hidden = hidden.detach()
                    captured[f"layer{layer_id}"] = self._gathered(hidden) if self.sp_group is not None else hidden

            return hook

        handles = [self.norm.register_forward_hook(hidden_hook)]
        for layer_id in self._feature_layers:
            if layer_id < len(self.layers):  # a layer not found is a missing part: nothing captured, never a crash
                hook = layer_input_hook(layer_id)
                handles.append(self.layers[layer_id].register_forward_pre_hook(hook, with_kwargs=True))
        if self._teacher_top_k > 0 and self.head is not None and self.sp_group is None:
            handles.append(self.head.register_forward_hook(logits_hook))
        try:
            result = self._forward_step(micro_batch, *args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
        begin = time.perf_counter()
        try:
            self._take(micro_batch, chosen, self._with_features(captured), captured.get("labels"))
        except Exception:  # capture must never break the RL step
            logger.exception("TLT hidden-state capture failed for a micro-batch; skipped")
        self.seconds += time.perf_counter() - begin
        return result

    def _with_features(self, captured: dict[str, Any]) -> torch.Tensor | None:
        """The final hidden states followed by the feature layers' ([.., (1 + n) * H]), or None if one is missing
        (a layer the forward skipped: nothing is captured rather than a sample with the wrong features)."""
        hidden = captured.get("hidden")
        if hidden is None or not self._feature_layers:
            return hidden
        parts = [captured.get(f"layer{layer_id}") for layer_id in self._feature_layers]
        if any(part is None or part.shape != hidden.shape for part in parts):
            logger.warning("TLT capture: a feature layer's hidden states were not seen this micro-batch; skipped")
            return None
        return torch.cat([hidden, *parts], dim=-1)

    def _gathered(self, local: torch.Tensor) -> torch.Tensor:
        """[1, N_pad, H]: this sequence-parallel group's slices of the packed row, in rank order (Ulysses slices the
        padded row into equal contiguous parts, rank r holding part r)."""
        import torch.distributed as dist

        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(self.sp_group))]
        dist.all_gather(parts, local.contiguous(), group=self.sp_group)
        return torch.cat(parts, dim=1)

    def _chosen_rows(self, micro_batch) -> list[tuple[int, list[tuple[int, int]]]]:
        """(row, windows to keep) of this micro-batch's sequences that the plan chose (taken off the plan)."""
        input_ids = micro_batch["input_ids"]
        offsets = input_ids.offsets().tolist()
        values = input_ids.values()
        chosen = []
        for row in range(len(offsets) - 1):
            key = _sequence_key(values[offsets[row] : offsets[row + 1]])
            if self._wanted.get(key):
                chosen.append((row, self._wanted[key].pop()))
        return chosen

    def _packed(self, micro_batch, tensor: torch.Tensor) -> torch.Tensor | None:
        """[N, ...] of a per-token output (hidden states, logits) in verl's packed order; None for a layout this
        does not know."""
        input_ids = micro_batch["input_ids"]
        lengths = input_ids.offsets().diff().tolist()
        num_tokens = sum(lengths)
        if tensor.dim() == 3 and tensor.shape[0] == 1 and tensor.shape[1] >= num_tokens:
            return tensor[0, :num_tokens]  # remove-padding layout (a static pad may follow the tokens)
        if tensor.dim() == 3 and tensor.shape[0] == len(lengths):
            return torch.cat([tensor[i, :n] for i, n in enumerate(lengths)])  # padded rows
        logger.warning("TLT capture: unexpected per-token output shape %s; skipped", tuple(tensor.shape))
        return None

    def _labels(
        self, micro_batch, chosen: list[tuple[int, list[tuple[int, int]]]], logits: torch.Tensor
    ) -> list[TeacherLabels] | None:
        """The teacher labels of every chosen window, in `chosen`'s order."""
        packed = self._packed(micro_batch, logits)
        if packed is None:
            return None
        offsets = micro_batch["input_ids"].offsets().tolist()
        return [
            labels_from_logits(packed[offsets[row] + start : offsets[row] + end], self._teacher_top_k)
            for row, windows in chosen
            for start, end in windows
        ]

    def _take(
        self,
        micro_batch,
        chosen: list[tuple[int, list[tuple[int, int]]]],
        hidden: torch.Tensor | None,
        labels: list[TeacherLabels] | None,
    ) -> None:
        if hidden is None or not self.keeps:
            return
        packed = self._packed(micro_batch, hidden)
        if packed is None:
            return
        input_ids, response_mask = micro_batch["input_ids"], micro_batch["response_mask"]
        offsets = input_ids.offsets().tolist()
        windows = [(row, start, end) for row, row_windows in chosen for start, end in row_windows]
        masks, step = response_mask.unbind(), self._armed[0]
        samples = samples_from_packed(input_ids.values(), packed, offsets, masks, windows, step)
        if labels is not None:
            samples = [sample.labelled(label) for sample, label in zip(samples, labels, strict=True)]
        self.samples += samples
