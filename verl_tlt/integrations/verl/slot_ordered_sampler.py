"""verl's sync replay buffer, with each sampled batch put in slot order, so that training is bitwise reproducible.

verl 0.9.1's V1 replay buffer hands the trainer a step's samples in the order they finished. That order follows
timing: which replica served a request, how busy the machine was, and whether a replica speculated. The actor's
update sums over the batch in that order and splits it over the data-parallel workers by it, so two runs of the same
config on the same samples compute their updates in a different floating-point order. Their weights then differ in
the last bits, and within a few steps a sampled token near a tie flips: two runs with TLT off, the same config and
the same slot-seeded samples, diverge after some steps.

`SlotOrderedReplayBuffer` returns the same samples, sorted by their slot: the step the prompt was drawn for, its
dataset index, the sample's number in its group, the output's number within the sample, then the prompt's tokens
(ties only among prompts without a dataset index). What is trained on, and how, is unchanged; only the order of the
sum is fixed. With it, and with the slot-seeded agent loop, runs of one config train to the same weights step after
step whatever the timing, so a run with TLT on can be compared with one with TLT off token for token, at every step.

It is enabled through verl's own seam for custom samplers (`trainer.v1.sampler.custom_sampler.{path,name}`, listed
with the slot-seeded agent loop in `same_samples.SAME_SAMPLES_OVERRIDES`; the quickstart and the e2e tests use them).
It extends the sync trainer's buffer and supports what verl passes a custom sampler; DAPO group filtering is not
among that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import transfer_queue as tq
from transfer_queue.metadata import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from verl_tlt.integrations.verl.same_samples import SAMPLER_NAME

# Per-sample fields read back from the transfer queue to find each sample's slot.
SLOT_FIELDS = ["index", "prompts"]

SlotKey = tuple[int, int, int, int, tuple[int, ...]]


def slot_key(key: str, tag: dict[str, Any], index: Any, prompt_ids: Sequence[int]) -> SlotKey:
    """The sort key of one sample: (step, dataset index, sample number, output number, prompt tokens).

    `key` is verl's transfer-queue key `{uid}_{session_id}_{output_index}`; the uid is random per run, so it is not
    part of the key. A missing dataset index sorts first and leaves the order to the prompt's tokens.
    """
    _, session_id, output_index = key.rsplit("_", 2)
    step = int(tag.get("global_steps") or 0)
    dataset_index = -1 if index is None else int(index)
    return step, dataset_index, int(session_id), int(output_index), tuple(int(t) for t in prompt_ids)


def slot_order(keys: Sequence[str], tags: Sequence[dict], indices: Sequence[Any], prompts: Sequence) -> list[int]:
    """Positions of the batch's samples in slot order (a permutation of range(len(keys)))."""
    if not len(keys) == len(tags) == len(indices) == len(prompts):
        raise ValueError(
            f"slot_order needs one tag, index and prompt per key, got {len(keys)} keys, {len(tags)} tags, "
            f"{len(indices)} indices and {len(prompts)} prompts"
        )
    sort_keys = [slot_key(k, t, i, p) for k, t, i, p in zip(keys, tags, indices, prompts, strict=True)]
    return sorted(range(len(keys)), key=sort_keys.__getitem__)


class SlotOrderedReplayBuffer(ReplayBuffer):
    """verl's replay buffer whose `sample` returns the batch in slot order (see the module docstring)."""

    def __init__(self, trainer_mode: str, *args: Any, **kwargs: Any) -> None:
        if trainer_mode != "sync":  # the async trainers need verl's ReplayBufferAsync semantics, not the sync ones
            raise ValueError(
                f"{SAMPLER_NAME} extends verl's sync replay buffer, but the trainer runs in mode {trainer_mode!r}. "
                "Fix: drop the trainer.v1.sampler.custom_sampler overrides, or run trainer.v1.trainer_mode=sync."
            )
        super().__init__(trainer_mode, *args, **kwargs)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        if len(batch.keys) < 2:
            return batch, metrics
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=SLOT_FIELDS)
        order = slot_order(batch.keys, batch.tags, _per_sample(data, "index"), _per_sample(data, "prompts"))
        ordered = KVBatchMeta(
            keys=[batch.keys[i] for i in order],
            tags=[batch.tags[i] for i in order],
            partition_id=batch.partition_id,
            fields=batch.fields,
            extra_info=batch.extra_info,
        )
        return ordered, metrics


def _per_sample(data: Any, field: str) -> list[Any]:
    """One plain Python value per sample from a TensorDict field (tensor, nested tensor or non-tensor stack)."""
    try:
        value = data[field]
    except KeyError:
        if field == "index":  # a dataset without an index column: order by the prompts alone
            return [None] * int(data.batch_size[0])
        raise
    if hasattr(value, "is_nested") and value.is_nested:
        return [row.tolist() for row in value.unbind(0)]
    if hasattr(value, "tolist"):
        return value.tolist()
    return list(value)
