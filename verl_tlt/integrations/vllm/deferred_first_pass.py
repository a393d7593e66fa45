"""K=0 steps without the drafter, and a drafter caught up when speculation resumes (runs in vLLM's workers).

vLLM's dynamic speculative decoding runs the EAGLE drafter's first pass on every step, K=0 included, only to keep
the drafter's KV cache complete: on a plain stretch that pass is all the cost SD adds (docs/vllm.md, "the K=0
tax"). Installed on a worker's model runner (``TLTWorkerExtension.tlt_install_catch_up``), this replaces the
proposer's ``propose`` on that one instance:

- a K=0 step whose requests are all past their prompt stores the step's tokens and target hidden states
  (``PendingHidden``) and returns no drafts: no drafter forward;
- before any other drafter pass (a speculative step, or a K=0 step with a prompt chunk, which runs vLLM's own pass
  so that prompt blocks other requests may share through the prefix cache hold the drafter's keys), and when a
  request's stored positions would pass ``window`` or the total the drafter's buffers take, one first pass runs
  over everything the step's requests have stored (catch-up): the drafter then holds exactly the cache it would
  have had from a pass every step, so it never attends to a slot it did not write.

The catch-up pass is vLLM's own ``propose`` with K=0, given the stored ranges as one query per request: attention
metadata derived from the step's (the same block tables, one row per caught-up request), the slot of each position
computed like vLLM's block table does; the first time, that computation is checked against vLLM's own slot mapping
for the step's tokens, and on a mismatch (a cache layout this code does not know) deferral switches itself off.

Outputs are vLLM's either way (drafts are verified by the target); what deferral changes is when the drafter's cache
is written, and what it costs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from typing import Any

import torch

from verl_tlt.integrations.vllm.pending_hidden import PendingHidden, Segments

logger = logging.getLogger(__name__)

DEFAULT_WINDOW = 64  # tlt.speculative.vllm_catch_up_window's default (see docs/benchmarks.md for the measured cost)


def unsupported_reason(runner: Any) -> str | None:
    """Why deferral cannot run on this model runner (None if it can)."""
    drafter = getattr(runner, "drafter", None)
    if drafter is None or not callable(getattr(drafter, "propose", None)):
        return "the model runner has no drafter (the engine runs without speculative_config, or Model Runner V2)"
    lacking = [name for name in ("max_num_tokens", "block_size") if not hasattr(drafter, name)]
    lacking += [name for name in ("input_batch", "requests") if not hasattr(runner, name)]
    if lacking:
        return f"this vLLM's model runner or proposer has no {lacking}"
    method = getattr(getattr(runner, "speculative_config", None), "method", None)
    if method not in ("eagle", "eagle3"):
        return f"speculative method {method!r} (deferral knows EAGLE-1 and EAGLE-3)"
    if getattr(drafter, "needs_extra_input_slots", False):
        return "parallel drafting (extra input slots per request)"
    if getattr(drafter, "uses_mrope", False) or getattr(drafter, "uses_xdrope_dim", 0):
        return "multi-dimensional rotary positions"
    if getattr(drafter, "supports_mm_inputs", False):
        return "a multimodal drafter"
    if getattr(getattr(runner, "parallel_config", None), "data_parallel_size", 1) > 1:
        return "data parallelism (every rank must run the same drafter forwards)"
    return None


class DeferredFirstPass:
    """Wraps one model runner's ``drafter.propose``: see the module's doc. ``counts`` are cumulative."""

    def __init__(self, runner: Any, window: int):
        self.runner, self.drafter = runner, runner.drafter
        self.pending = PendingHidden(window, int(self.drafter.max_num_tokens))
        self.counts: Counter[str] = Counter()
        self.seconds = 0.0  # spent in catch-up passes
        self.enabled = True
        self._layout_checked = False
        self._propose = self.drafter.propose  # vLLM's bound method: the first pass and the drafts

    def install(self) -> DeferredFirstPass:
        self.drafter.propose = self.propose  # this instance only; the class keeps vLLM's method
        return self

    @property
    def window(self) -> int:
        return self.pending.window

    def stats(self) -> dict[str, float]:
        return {
            **self.counts,
            "catch_up_seconds": round(self.seconds, 4),
            "pending_requests": len(self.pending),
            "ring_bytes": self.pending.ring_bytes(),
        }

    # ----- the proposer's entry point --------------------------------------------------------------------------------

    def propose(
        self,
        num_speculative_tokens: int,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        next_token_ids: torch.Tensor,
        token_indices_to_sample: torch.Tensor | None,
        common_attn_metadata: Any,
        sampling_metadata: Any,
        mm_embed_inputs: Any = None,
        num_rejected_tokens_gpu: torch.Tensor | None = None,
        slot_mappings: Any = None,
    ) -> torch.Tensor:
        vllm_pass = {
            "num_speculative_tokens": num_speculative_tokens,
            "target_token_ids": target_token_ids,
            "target_positions": target_positions,
            "target_hidden_states": target_hidden_states,
            "next_token_ids": next_token_ids,
            "token_indices_to_sample": token_indices_to_sample,
            "common_attn_metadata": common_attn_metadata,
            "sampling_metadata": sampling_metadata,
            "mm_embed_inputs": mm_embed_inputs,
            "num_rejected_tokens_gpu": num_rejected_tokens_gpu,
            "slot_mappings": slot_mappings,
        }
        if not self.enabled:
            return self._propose(**vllm_pass)
        cad = common_attn_metadata
        batch = list(self.runner.input_batch.req_ids[: self.runner.input_batch.num_reqs])
        query_start_loc = cad.query_start_loc_cpu[: len(batch) + 1].tolist()
        self.pending.keep_only(self.runner.requests)
        step = (batch, query_start_loc, target_token_ids, target_positions, cad, sampling_metadata)
        if num_speculative_tokens == 0 and not self._has_prompt_rows(cad, len(batch)):
            lengths = [query_start_loc[i + 1] - query_start_loc[i] for i in range(len(batch))]
            fits = self.pending.fits(batch, lengths)
            if not fits:  # make room: what is stored is caught up now, then this step may fit on its own
                self._catch_up(*step)
                fits = self.pending.fits(batch, lengths)
            if fits and self._layout_ok(cad, query_start_loc, target_positions):
                self.pending.defer(batch, query_start_loc, target_token_ids, target_positions, target_hidden_states)
                self.counts["deferred_steps"] += 1
                self.counts["deferred_tokens"] += query_start_loc[-1]
                self.drafter.num_speculative_tokens = 0  # what vLLM's own K=0 pass leaves behind
                if hasattr(self.drafter, "_last_draft_probs"):
                    self.drafter._last_draft_probs = None
                return torch.empty(cad.batch_size(), 0, dtype=torch.int64, device=target_positions.device)
        self._catch_up(*step)
        self.counts["first_pass_steps"] += 1
        return self._propose(**vllm_pass)

    # ----- internals ---------------------------------------------------------------------------------------------

    def _has_prompt_rows(self, cad: Any, num_reqs: int) -> bool:
        """Whether any row of the step is (still) a prompt chunk: vLLM's own first pass writes those."""
        flags = getattr(cad, "is_prefilling", None)
        if flags is None:
            batch = self.runner.input_batch
            return bool((batch.num_computed_tokens_cpu[:num_reqs] < batch.num_prompt_tokens[:num_reqs]).any())
        return bool(flags[:num_reqs].any())

    def _catch_up(self, batch, query_start_loc, token_ids, positions, cad, sampling_metadata) -> None:
        segments, broken = self.pending.take(batch, query_start_loc, token_ids, positions)
        if broken:
            self.counts["dropped_ranges"] += len(broken)
            logger.warning(
                "TLT: dropped the stored drafter context of %d request(s) whose position moved below it "
                "(recomputed after a preemption); their drafter attends to what vLLM's own passes wrote",
                len(broken),
            )
        if segments is None:
            return
        began = time.perf_counter()
        self._propose(
            num_speculative_tokens=0,
            target_token_ids=segments.token_ids,
            target_positions=segments.positions,
            target_hidden_states=segments.hidden_states,
            next_token_ids=segments.next_token_ids,
            token_indices_to_sample=None,
            common_attn_metadata=segment_metadata(cad, segments, self.drafter.block_size),
            sampling_metadata=sampling_metadata,
        )
        self.counts["catch_ups"] += 1
        self.counts["caught_up_tokens"] += segments.num_tokens
        # Wall time of the pass as the host sees it: all of it on CPU; on a GPU, what launching it took (no sync).
        self.seconds += time.perf_counter() - began

    def _layout_ok(self, cad: Any, query_start_loc: list[int], positions: torch.Tensor) -> bool:
        """Once: does ``slot_mapping_for`` reproduce vLLM's slot mapping for this step's own tokens?"""
        if self._layout_checked:
            return True
        num_tokens = query_start_loc[-1]
        lengths = torch.tensor([b - a for a, b in zip(query_start_loc, query_start_loc[1:], strict=False)])
        rows = torch.repeat_interleave(torch.arange(len(lengths)), lengths).to(cad.block_table_tensor.device)
        mine = slot_mapping_for(cad.block_table_tensor, rows, positions[:num_tokens], self.drafter.block_size)
        if not torch.equal(mine.to(cad.slot_mapping.dtype), cad.slot_mapping[:num_tokens]):
            self.enabled = False
            self.counts["layout_mismatch"] += 1
            logger.error(
                "TLT: the drafter's KV slots computed from the block table (block size %d) differ from vLLM's slot "
                "mapping: deferring the drafter's first pass is off for this engine (vLLM's pass runs every step)",
                self.drafter.block_size,
            )
            return False
        self._layout_checked = True
        return True


def slot_mapping_for(
    block_table: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """The KV-cache slot of each token: row `rows[i]` of `block_table`, position `positions[i]`."""
    positions = positions.to(torch.int64)
    blocks = block_table[rows, positions // block_size].to(torch.int64)
    return blocks * block_size + positions % block_size


def segment_metadata(cad: Any, segments: Segments, block_size: int) -> Any:
    """vLLM's ``CommonAttentionMetadata`` for one first pass over `segments`: a query per caught-up request over
    its stored range, whose context ends where the range ends (everything before it is in the drafter's cache)."""
    device = cad.query_start_loc.device
    count = len(segments.rows)
    lengths = torch.tensor([end - start for start, end in zip(segments.starts, segments.ends, strict=True)])
    query_start_loc_cpu = torch.zeros(count + 1, dtype=cad.query_start_loc_cpu.dtype)
    query_start_loc_cpu[1:] = torch.cumsum(lengths, 0)
    block_table = cad.block_table_tensor[torch.tensor(segments.rows, device=cad.block_table_tensor.device)]
    rows = torch.repeat_interleave(torch.arange(count), lengths).to(block_table.device)
    seq_lens_cpu = torch.tensor(segments.ends, dtype=cad.seq_lens.dtype)
    values = {
        "query_start_loc": query_start_loc_cpu.to(device),
        "query_start_loc_cpu": query_start_loc_cpu,
        "seq_lens": seq_lens_cpu.to(device),
        "num_reqs": count,
        "num_actual_tokens": segments.num_tokens,
        "max_query_len": int(lengths.max()),
        "max_seq_len": max(segments.ends),
        "block_table_tensor": block_table,
        "slot_mapping": slot_mapping_for(block_table, rows, segments.positions, block_size).to(cad.slot_mapping.dtype),
        "positions": segments.positions,
        "seq_lens_cpu_upper_bound": seq_lens_cpu,
        "_seq_lens_cpu": seq_lens_cpu,
        "_num_computed_tokens_cpu": torch.tensor(segments.starts, dtype=cad.seq_lens.dtype),
        "_num_computed_tokens_cache": None,
        "is_prefilling": torch.zeros(count, dtype=torch.bool),
        # Per-row extras of the step's batch that do not describe these rows: none of them apply to a text drafter.
        "logits_indices_padded": None,
        "num_logits_indices": None,
        "encoder_seq_lens": None,
        "encoder_seq_lens_cpu": None,
        "dcp_local_seq_lens": None,
        "dcp_local_seq_lens_cpu": None,
        "mm_req_doc_ranges": None,
        "rswa_prefix_lens": None,
        "replayssm_decode_base_cpu": None,
    }
    names = {field.name for field in dataclasses.fields(cad)}
    return dataclasses.replace(cad, **{name: value for name, value in values.items() if name in names})
