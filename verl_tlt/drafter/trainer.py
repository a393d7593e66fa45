"""Preemptible training of the EAGLE drafter: short bursts that stop within one optimizer step when told to.

Loss (EAGLE-1/2, `verl_tlt.drafter.losses`): hidden_loss_weight * SmoothL1(predicted feature, target feature) +
logit_loss_weight * soft cross-entropy between the target's next-token distribution and the drafter's; both
weights are `tlt.drafter` keys (EAGLE's 1.0 and 0.1), both averaged over the pairs whose predicted position is a
response token. Only fc and the decoder layer train; the shared embedding and LM head are the target's, frozen.

What a step costs does not grow with the target's vocabulary: samples are labelled once, when they are added
(`add_samples`: the target's top-`teacher_top_k` distribution, `verl_tlt.drafter.teacher`), the drafter's head
covers the draft vocabulary (`draft_vocab_size` most frequent response tokens, grown by appending as data comes),
and the token loss runs in chunks. `teacher_top_k=0` keeps the dense recipe (the target's head at every step).
Where the device runs bf16 natively (`verl_tlt.drafter.precision`), steps run under bf16 autocast with the fp32
weights as masters.

Checkpoints hold model, optimizer, step count, RNG and the data buffer's cursor (optionally its samples), as JSON
plus safetensors (`verl_tlt.drafter.checkpoint`: nothing is unpickled on loading). They are written atomically by a
background thread after a synchronous copy to CPU, so a save costs the trainer only that copy and a crash never
leaves a half-written checkpoint.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from verl_tlt.config import DrafterConfig
from verl_tlt.drafter.checkpoint import read_checkpoint, write_checkpoint
from verl_tlt.drafter.data import DrafterDataBuffer, DrafterSample, PackedBatch
from verl_tlt.drafter.draft_vocab import DraftVocab, response_token_counts
from verl_tlt.drafter.evaluate import ESTIMATE_DEPTH, estimated_acceptance_length
from verl_tlt.drafter.losses import drafter_losses, unrolled_losses
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.drafter.offload import FrozenOnload
from verl_tlt.drafter.precision import autocast_dtype
from verl_tlt.drafter.teacher import teacher_labels
from verl_tlt.drafter.unroll import unrolled_forward
from verl_tlt.progress import Progress

logger = logging.getLogger(__name__)

# AdamW betas: EAGLE's training recipe, which the loss, its weights and the default gradient clip also follow.
ADAMW_BETAS = (0.9, 0.95)
# No weight decay: the decoder layer starts as a copy of the target's last layer (or a warmed-up drafter), and
# decay would pull it toward zero, away from that start, at every step whatever the data says.
WEIGHT_DECAY = 0.0


@dataclass
class TrainReport:
    """What one `train` call did and why it returned."""

    steps: int = 0  # optimizer steps taken
    tokens: int = 0
    seconds: float = 0.0
    stopped_by: str = "max_steps"  # max_steps | stop | deadline | no_data
    last_metrics: dict[str, float] = field(default_factory=dict)  # of the last step taken
    skipped_steps: int = 0  # batches whose loss or gradient was not finite: no optimizer step (see train_step)


class DrafterTrainer:
    """Trains `model` on `buffer` with the `tlt.drafter` recipe (lr, batch, depths, loss weights, input noise).

    seed: of the input noise's generator (part of the checkpointed state, so a resumed run draws the same noise).
    """

    def __init__(
        self, model: EagleDrafterModel, buffer: DrafterDataBuffer, config: DrafterConfig | None = None, *, seed: int = 0
    ):
        self.model, self.buffer = model, buffer
        self.config = config or DrafterConfig()
        self.device, self.dtype = model.fc.weight.device, model.fc.weight.dtype
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=self.config.lr, betas=ADAMW_BETAS, weight_decay=WEIGHT_DECAY)
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.global_step = 0
        # Pairs trained and seconds spent in train() over this trainer's life (every call): what progress lines show,
        # so a run that trains in stretches (the warm-up's, between checkpoints) reports its totals, not a stretch's.
        self.trained_tokens, self.training_seconds = 0, 0.0
        self.autocast = autocast_dtype(self.device) if self.dtype == torch.float32 else None
        self.last_draft_vocab_miss: float | None = None  # share of the last added response tokens outside the map
        self._pending_vocab: DraftVocab | None = None  # a grown map, taken up at the next step's start
        self._vocab_lock = threading.Lock()
        self._save_thread: threading.Thread | None = None
        self._save_error: BaseException | None = None  # set by a failed background save, raised by wait_for_save
        self._target_onload: FrozenOnload | None = None  # the target parts' device copy during a burst

    # ----- where it trains ------------------------------------------------------------------------------------

    def to_device(self, device: torch.device | str) -> None:
        """Move the drafter, the target parts it shares (embedding, head) and the optimizer's moments to `device`:
        a burst's onload to the accelerator and its offload back to host memory. Not while a step runs."""
        device = torch.device(device)
        if device == self.device:
            return
        self.model.to(device)
        # The frozen target parts: copied to a device with their host tensors kept, and pointed back at them when
        # they return (drafter.offload); the drafter's own weights and moments change, so they travel both ways.
        if self._target_onload is not None:
            self._target_onload.offload()
            self._target_onload = None
        if device.type != "cpu":
            self._target_onload = FrozenOnload(self.model.target, device)
        else:
            self.model.target.to(device)
        for state in self.optimizer.state.values():
            for key, value in state.items():
                # AdamW keeps its step count as a 0-d CPU tensor (unless capturable): it stays where it is.
                if torch.is_tensor(value) and value.dim() > 0:
                    state[key] = value.to(device)
        self.model.drop_derived_weights()  # the draft head's rows were cut on the other device
        self.device = device
        self.autocast = autocast_dtype(device) if self.dtype == torch.float32 else None

    def tensors_off(self, device: torch.device | str) -> list[str]:
        """Names of the tensors this trainer holds that are not on `device` (what an offload must leave empty)."""
        device = torch.device(device)
        found = [f"drafter.{n}" for n, t in self.model.state_dict().items() if t.device.type != device.type]
        found += [f"target.{n}" for n, t in self.model.target.state_dict().items() if t.device.type != device.type]
        derived = getattr(self.model, "_draft_head", None)  # EAGLE-1's copy of the head's draft rows
        if derived is not None and derived[1].device.type != device.type:
            found.append("drafter.draft_head_rows")
        for index, state in enumerate(self.optimizer.state.values()):
            found += [
                f"optimizer.{index}.{key}"
                for key, value in state.items()
                if torch.is_tensor(value) and value.dim() > 0 and value.device.type != device.type
            ]
        return found

    # ----- data -----------------------------------------------------------------------------------------------

    def add_samples(self, samples: list[DrafterSample], hold: Collection[int] = ()) -> int:
        """Label `samples` (the target's sparse distribution, unless they carry it), choose or grow the draft
        vocabulary from their response tokens, and add them to the buffer (those at positions `hold` kept out of
        batches until the buffer releases them); returns how many were added.

        Safe while training runs in another thread: a grown map takes effect at the next step's start.
        """
        samples = [self._prepared(sample) for sample in samples]
        if self.config.draft_vocab_size > 0 and samples:
            self._update_draft_vocab(samples)
        return self.buffer.add(samples, hold)

    def _prepared(self, sample: DrafterSample) -> DrafterSample:
        """The sample as the buffer keeps it: labelled (with teacher_top_k > 0) from the target's final hidden state,
        holding only the features the drafter reads (EAGLE-3 drops the final state once it is labelled)."""
        final, features = self.model.split_captured(sample.hidden_states)
        teacher = sample.teacher
        wanted_k = min(self.config.teacher_top_k, self.vocab_size)
        if self.config.teacher_top_k > 0 and (teacher is None or teacher.top_k != wanted_k):
            if final is None:
                raise ValueError(
                    "an unlabelled EAGLE-3 sample must carry the target's final hidden state to be labelled from "
                    "(capture [final | aux layers], as the target does with feature_layers set)"
                )
            head = self.model.target.lm_head.weight  # on the training device during a burst: label there, keep on host
            teacher = teacher_labels(final.to(head.device), head, self.config.teacher_top_k).to("cpu")
        if features is sample.hidden_states and teacher is sample.teacher:
            return sample
        return DrafterSample(sample.token_ids, features, sample.response_mask, sample.step, teacher)

    @property
    def vocab_size(self) -> int:
        return self.model.spec.vocab_size

    def _update_draft_vocab(self, samples: list[DrafterSample]) -> None:
        counts = response_token_counts(samples, self.vocab_size)
        with self._vocab_lock:
            current = self._pending_vocab if self._pending_vocab is not None else self.model.chosen_vocab
            if current is None:
                self._pending_vocab = DraftVocab.from_counts(counts, self.config.draft_vocab_size)
                self.last_draft_vocab_miss = None
                return
            responses = torch.cat([s.token_ids[s.response_mask] for s in samples])
            self.last_draft_vocab_miss = current.miss_share(responses)
            grown = current.grown(counts)
            if grown is not current:
                self._pending_vocab = grown

    def apply_draft_vocab(self) -> None:
        """Take up a chosen or grown draft vocabulary (each step does first; call it between steps to do it now)."""
        with self._vocab_lock:
            vocab, self._pending_vocab = self._pending_vocab, None
        if vocab is not None:
            self.model.set_draft_vocab(vocab)

    # ----- training ------------------------------------------------------------------------------------------

    def _progress_extra(self, report: TrainReport, call_start: float) -> str:
        """The line's extra text: the last step's scores, and tokens and tokens/s over the trainer's life."""
        return _progress_text(report, self.trained_tokens, self.training_seconds + time.monotonic() - call_start)

    def train(
        self,
        stop: threading.Event | None = None,
        max_steps: int | None = None,
        deadline: float | None = None,
        progress: Progress | None = None,
        between_steps: Callable[[], None] | None = None,
        min_steps: int = 0,
    ) -> TrainReport:
        """Run optimizer steps until max_steps, `stop` is set, time.monotonic() passes deadline, or no data.

        The checks happen before every step, so once told to stop this returns within one step's time.
        progress: told the optimizer steps taken after every step, with the last step's loss (long offline runs).
        between_steps: called after every optimizer step (a worker scores a group of samples there), so a burst
        cut short still trains first: a stop then waits for at most one step or one such call.
        min_steps: optimizer steps (taken or skipped) before `stop` is heeded (tests make a burst's training
        independent of when the stop comes with it).
        """
        report, start = TrainReport(), time.monotonic()
        while True:
            if stop is not None and report.steps + report.skipped_steps >= min_steps and stop.is_set():
                report.stopped_by = "stop"
                break
            if deadline is not None and time.monotonic() >= deadline:
                report.stopped_by = "deadline"
                break
            if max_steps is not None and report.steps + report.skipped_steps >= max_steps:
                report.stopped_by = "max_steps"
                break
            batch = self.buffer.next_batch(self.config.max_tokens_per_batch)
            if batch is None:
                report.stopped_by = "no_data"
                break
            metrics = self.train_step(batch)
            if metrics.get("skipped"):
                report.skipped_steps += 1
                continue
            report.last_metrics = metrics
            report.steps += 1
            report.tokens += batch.num_pairs
            self.trained_tokens += batch.num_pairs
            if progress is not None:
                progress.update(report.steps, lambda: self._progress_extra(report, start))
            if between_steps is not None:
                between_steps()
        report.seconds = time.monotonic() - start
        self.training_seconds += report.seconds
        if report.skipped_steps:
            logger.warning(
                "Drafter training skipped %d of %d batches (non-finite loss or gradient)",
                report.skipped_steps,
                report.steps + report.skipped_steps,
            )
        return report

    def train_step(self, batch: PackedBatch) -> dict[str, float]:
        """One optimizer step on a packed batch; returns its metrics.

        A batch whose loss or gradient is not finite (e.g. a captured sample with inf/NaN hidden states) takes no
        step and returns {"skipped": 1.0, "loss": ...}: one AdamW step on NaN gradients would put NaN into its
        moments, and every later step would then turn the weights into NaN however good its data.
        """
        self.apply_draft_vocab()
        self.model.train()
        batch = batch.to(self.device, self.dtype)
        if self.config.teacher_top_k == 0:
            batch.teacher = None  # the dense recipe, whatever the samples carry
        input_hidden = batch.input_hidden
        if self.config.input_noise > 0:
            noise = torch.rand(input_hidden.shape, generator=self.generator) * 2 - 1
            input_hidden = input_hidden + self.config.input_noise * noise.to(self.device, self.dtype)
        with torch.autocast(self.device.type, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            losses = self._losses(batch, input_hidden)
        loss = self.weighted_loss(losses)
        self.optimizer.zero_grad(set_to_none=True)
        if not bool(torch.isfinite(loss)) or not bool(batch.loss_mask.any()):
            self.model.eval()
            return {"skipped": 1.0, "loss": float(loss.detach())}
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip_norm)
        if not bool(torch.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            self.model.eval()
            return {"skipped": 1.0, "loss": float(loss.detach()), "grad_norm": float(grad_norm)}
        self.optimizer.step()
        self.global_step += 1
        self.model.eval()
        accuracy = float(losses["top1_accuracy"])
        return {
            "loss": float(loss.detach()),
            "hidden_loss": float(losses["hidden_loss"].detach()),
            "logit_loss": float(losses["logit_loss"].detach()),
            "top1_accuracy": accuracy,
            "est_acceptance_length": estimated_acceptance_length(accuracy, ESTIMATE_DEPTH),
            "grad_norm": float(grad_norm),
            "num_pairs": float(batch.loss_mask.sum()),
        }

    def weighted_loss(self, losses: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss a step minimises: the feature and token losses under the recipe's weights, in fp32."""
        return (
            self.config.hidden_loss_weight * losses["hidden_loss"].float()
            + self.config.logit_loss_weight * losses["logit_loss"].float()
        )

    def _losses(self, batch: PackedBatch, input_hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        depth = self.config.unroll_depth
        if depth == 1:
            features = self.forward(batch, input_hidden)
            return drafter_losses(self.model, features, batch.target_hidden, batch.loss_mask, batch.teacher)
        return unrolled_losses(self.model, batch, input_hidden, depth, self.config.depth_decay)

    def forward(self, batch: PackedBatch, input_hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Drafter features [1, N, H] for a packed batch (a scratch KV cache stands in for the inference cache)."""
        return drafter_forward(self.model, batch, batch.input_hidden if input_hidden is None else input_hidden)

    # ----- checkpoints ---------------------------------------------------------------------------------------

    def state_dict(self, *, include_samples: bool = True) -> dict:
        """CPU copies of everything training continues from: model, optimizer, step, RNG, buffer cursor
        (and, optionally, the buffer's samples)."""
        return {
            "model": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()},
            "optimizer": _to_cpu(self.optimizer.state_dict()),
            "global_step": self.global_step,
            "generator": self.generator.get_state(),
            "config": asdict(self.config),
            "buffer": _to_cpu(self.buffer.state_dict(include_samples=include_samples)),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()` output (this trainer's or another's with the same drafter shape)."""
        self.model.load_state_dict(state["model"])  # the draft vocabulary with it
        with self._vocab_lock:
            self._pending_vocab = None  # chosen before the state it came from: the state's map wins
        self.optimizer.load_state_dict(state["optimizer"])
        self.global_step = state["global_step"]
        self.generator.set_state(state["generator"])
        self.buffer.load_state_dict(state["buffer"])

    def save_checkpoint(self, directory: str | os.PathLike, *, include_samples: bool = True, wait: bool = False):
        """Copy the state to CPU now, write it in the background (atomically). Returns the thread.

        With wait=True a failed write raises here. A background save that fails is logged when it fails; the next
        `wait_for_save()` raises it, while the next `save_checkpoint` (which supersedes it) only waits for it.
        """
        self._join_save()
        self._save_error = None
        state = self.state_dict(include_samples=include_samples)
        self._save_thread = threading.Thread(
            target=self._save_in_background, args=(state, Path(directory)), daemon=True
        )
        self._save_thread.start()
        if wait:
            self.wait_for_save()
        return self._save_thread

    def wait_for_save(self) -> None:
        """Wait for the background save; raise RuntimeError if it failed (the previous checkpoint is then kept)."""
        self._join_save()
        error, self._save_error = self._save_error, None
        if error is not None:
            raise RuntimeError(f"Saving the drafter checkpoint failed: {error}") from error

    def _join_save(self) -> None:
        if self._save_thread is not None:
            self._save_thread.join()
            self._save_thread = None

    def _save_in_background(self, state: dict, directory: Path) -> None:
        try:
            write_checkpoint(directory, state)
        except Exception as error:
            logger.exception("Saving the drafter checkpoint to %s failed; the previous checkpoint is kept", directory)
            self._save_error = error

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Continue from a checkpoint directory (or from the previous one that an interrupted save left aside).

        Raises FileNotFoundError if there is none, ValueError (naming the file and what is wrong) if it cannot be
        read or does not fit this trainer; the trainer is then left as it was.
        """
        state, path = read_checkpoint(directory, self.optimizer)
        backup = self.state_dict(include_samples=False)
        try:
            self.load_state_dict(state)
        except Exception as error:  # e.g. a drafter of another shape
            self.load_state_dict(backup)  # a half-applied state (strict loads copy what fits) is undone
            raise ValueError(f"Cannot load drafter trainer checkpoint {path}: {error}") from error


def _progress_text(report: TrainReport, tokens: int, seconds: float) -> str:
    """The last step's loss and accuracy; pairs trained and tokens/s over the trainer's life (see trained_tokens)."""
    metrics = report.last_metrics
    shown = [f"{key} {metrics[key]:.4f}" for key in ("loss", "top1_accuracy") if key in metrics]
    return ", ".join(shown + [f"{tokens} tokens", f"{tokens / max(seconds, 1e-9):.0f} tokens/s"])


def drafter_forward(model: EagleDrafterModel, batch: PackedBatch, input_hidden: torch.Tensor) -> torch.Tensor:
    """The drafter's features [1, N, H] for every pair of a packed batch, read from the target's features: the first
    depth of the unrolled chain."""
    return unrolled_forward(model, batch, 1, input_hidden)[0].features


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value
