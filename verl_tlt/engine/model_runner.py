"""The target's forward passes over the slot KV cache: prefill, decode and tree verification.

One object owns how the target runs: eagerly, through torch.compile (engine.compiled_forward), from CUDA graphs
(engine.cuda_graphs) and with CPU weight layouts (engine.cpu_kernels). Each step kind builds its own inputs
(positions, cache write positions, attention mask) here, so the engine above deals in requests and tokens only.
"""

from __future__ import annotations

import logging

import torch

from verl_tlt.engine.compiled_forward import CompiledForward
from verl_tlt.engine.config import EngineConfig
from verl_tlt.engine.cpu_kernels import setup_cpu_kernels
from verl_tlt.engine.cuda_graphs import StepGraphPool, graph_batch_buckets
from verl_tlt.engine.kv_cache import SlotKVCache
from verl_tlt.modeling.model import AttentionBatch, CausalLM
from verl_tlt.spec.tree import DraftTree, tree_attention_mask

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig,
        *,
        cache_len: int,
    ):
        self.model = model.eval()
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.kernel_plan = setup_cpu_kernels(model, config.cpu_layouts, config.cpu_kernels)
        # torch.compile'd target forwards, one per kind of step; None runs eagerly.
        self.compiled = CompiledForward(model) if config.compile else None
        cuda_graphs = config.cuda_graphs
        if cuda_graphs and self.device.type != "cuda":
            logger.warning("RolloutEngine(cuda_graphs=True) on %s: CUDA graphs need CUDA; not using them", self.device)
            cuda_graphs = False
        # CUDA graphs are built when the engine's first decode step asks (it knows the batch sizes and widths).
        self.wants_graphs = cuda_graphs
        self.graphs: StepGraphPool | None = None
        self.cache = SlotKVCache(model.spec, dtype=self.dtype, device=self.device, max_len=cache_len)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)

    def prefill(self, prompts: list[list[int]], row_start: int) -> torch.Tensor:
        """Write the prompts into slots row_start.. and return their hidden states [N, T, H] (right-padded)."""
        lengths = [len(p) for p in prompts]
        rows, seq = len(prompts), max(lengths)
        self.cache.ensure_capacity(row_start + rows, seq + 1)
        input_ids = torch.zeros(rows, seq, dtype=torch.long, device=self.device)
        for row, prompt in enumerate(prompts):
            input_ids[row, : lengths[row]] = torch.tensor(prompt, device=self.device)
        positions = torch.arange(seq, device=self.device).expand(rows, seq)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=self.device).tril()
        return self.forward("prefill", input_ids, positions, row_start, positions, causal.expand(rows, 1, seq, seq))

    def decode(self, last_tokens: list[int], cache_lens: list[int]) -> torch.Tensor:
        """One token per running row (slot i has cache_lens[i] tokens); returns hidden states [B, 1, H]."""
        lens = torch.tensor(cache_lens, device=self.device)  # [B]
        self.cache.ensure_capacity(len(cache_lens), max(cache_lens) + 1)
        input_ids = torch.tensor(last_tokens, device=self.device).unsqueeze(-1)
        positions = lens.unsqueeze(-1)  # [B, 1]
        kv_len = int(lens.max()) + 1
        mask = (torch.arange(kv_len, device=self.device) <= positions).view(len(cache_lens), 1, 1, kv_len)
        return self.forward("decode", input_ids, positions, 0, positions, mask)

    def verify(self, tree: DraftTree, cache_lens: list[int]) -> torch.Tensor:
        """Every node of every row's draft tree in one forward, written in scratch positions after the row's
        prefix (tree_forward_layout); returns hidden states [B, N+1, H]."""
        self.cache.ensure_capacity(len(cache_lens), max(cache_lens) + tree.num_nodes)
        positions, write_pos, mask = tree_forward_layout(tree, torch.tensor(cache_lens, device=self.device))
        return self.forward("verify", tree.tokens, positions, 0, write_pos, mask)

    def forward(self, kind: str, input_ids, positions, row_start, write_pos, mask) -> torch.Tensor:
        cos, sin = self.model.rotary_tables(positions, self.dtype, max_position=mask.shape[-1])
        batch = AttentionBatch(row_start=row_start, write_pos=write_pos, attn_mask=mask, cos=cos, sin=sin)
        graphs = self.graphs
        if kind != "prefill" and row_start == 0 and graphs is not None:
            if graphs.serves(input_ids.shape[1], input_ids.shape[0]):
                return graphs.run(input_ids, positions, write_pos, mask, cos, sin)
        if self.compiled is not None:
            return self.compiled(kind, input_ids, positions, batch, self.cache.k, self.cache.v)
        return self.model(input_ids, positions, batch, self.cache.k, self.cache.v)

    def enable_step_graphs(
        self,
        max_num_seqs: int,
        widths: set[int] | None = None,
        verify_max_batch: int | None = None,
        capture: bool = True,
    ) -> StepGraphPool:
        """Serve decode and verify forwards from a StepGraphPool from now on (see RolloutEngine.enable_step_graphs)."""
        self.graphs = StepGraphPool(
            self.model,
            self.cache,
            self.model.spec.head_dim,
            self.dtype,
            batch_buckets=graph_batch_buckets(max_num_seqs),
            widths=widths,
            verify_max_batch=verify_max_batch,
            min_slots=max_num_seqs,
            capture=capture,
        )
        self.wants_graphs = True
        return self.graphs

    def move_slot(self, src: int, dst: int, length: int) -> None:
        self.cache.move_slot(src, dst, length)

    def release_cache(self) -> None:
        if self.graphs is not None:
            self.graphs.reset()  # they point into the cache
        self.cache.release()


def tree_forward_layout(tree: DraftTree, cache_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positions, cache write positions and attention mask for verifying `tree` in one target forward.

    Node i of row b is written at cache position cache_lens[b] + i (scratch beyond the committed prefix) and
    attends to the committed prefix plus its own ancestors. Returns positions [B, N+1] (cache_lens + depth),
    write_pos [B, N+1] and mask [B, 1, N+1, L] with L = max(cache_lens) + N + 1.
    """
    rows, num_nodes = tree.tokens.shape
    device = tree.tokens.device
    kv_len = int(cache_lens.max()) + num_nodes
    write_pos = cache_lens.unsqueeze(1) + torch.arange(num_nodes, device=device)  # [B, N+1]
    if tree.is_chain:  # a chain's nodes are its own ancestors in order: the mask is causal
        mask = torch.arange(kv_len, device=device).view(1, 1, kv_len) <= write_pos.unsqueeze(-1)
        return write_pos, write_pos, mask.unsqueeze(1)
    prefix = torch.arange(kv_len, device=device).unsqueeze(0) < cache_lens.unsqueeze(1)  # [B, L]
    mask = prefix.unsqueeze(1).expand(rows, num_nodes, kv_len).clone()
    mask.scatter_(2, write_pos.unsqueeze(1).expand(rows, num_nodes, num_nodes), tree_attention_mask(tree.parents))
    return cache_lens.unsqueeze(1) + tree.depths, write_pos, mask.unsqueeze(1)
