"""A Ulysses-style sequence-parallel forward for the capture test, run in spawned gloo processes.

Each rank pads the packed [1, N] row to a multiple of the group's size and computes its contiguous slice (as
verl's `ulysses_pad_and_slice_inputs` does) through an embedding and a final norm, the module the capture hooks.
Per-token layers only: every rank's slice is what an unsplit forward computes for those positions.
"""

from __future__ import annotations

import torch

from verl_tlt.integrations.verl.hidden_capture import HiddenStateCapture

VOCAB, HIDDEN = 50, 16
ROWS = [(3, 9), (2, 5), (4, 12), (1, 3)]  # (prompt, response) lengths: N = 39, odd, so the pad is exercised


class Body(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.norm = torch.nn.LayerNorm(HIDDEN)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = Body()


class SequenceParallelEngine:
    def __init__(self, sp_rank: int, sp_size: int):
        self.module, self.sp_rank, self.sp_size = Model(), sp_rank, sp_size
        self.use_ulysses_sp = sp_size > 1

    def forward_step(self, micro_batch, loss_function=None, forward_only=True):
        ids = micro_batch["input_ids"].values()
        padded = -(-ids.numel() // self.sp_size) * self.sp_size
        ids = torch.cat([ids, torch.zeros(padded - ids.numel(), dtype=ids.dtype)])
        part = padded // self.sp_size
        local = ids[self.sp_rank * part : (self.sp_rank + 1) * part].unsqueeze(0)
        with torch.no_grad():
            return self.module.model.norm(self.module.model.embed_tokens(local))


def batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = [torch.randint(3, VOCAB, (p + r,), generator=generator) for p, r in ROWS]
    masks = [torch.ones(r, dtype=torch.long) for _, r in ROWS]
    return {
        "input_ids": torch.nested.nested_tensor(ids, layout=torch.jagged),
        "response_mask": torch.nested.nested_tensor(masks, layout=torch.jagged),
    }


def capture(sp_rank: int, sp_size: int, group) -> list:
    """One armed forward of two micro-batches; what this rank kept."""
    engine = SequenceParallelEngine(sp_rank, sp_size)
    capture = HiddenStateCapture(engine, sp_group=group, keeps=sp_rank == 0)
    data = batch()

    def infer_batch(data):
        ids, masks = data["input_ids"].unbind(), data["response_mask"].unbind()
        for i in (0, 2):
            micro = {
                "input_ids": torch.nested.nested_tensor(list(ids[i : i + 2]), layout=torch.jagged),
                "response_mask": torch.nested.nested_tensor(list(masks[i : i + 2]), layout=torch.jagged),
            }
            engine.forward_step(micro)

    capture.arm(step=1, token_budget=30)  # not everything: the plan's choice must agree across ranks
    capture.wrap(infer_batch)(data)
    return capture.pop()[0]


def run_rank(rank: int, world: int, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"file://{out_dir}/rendezvous")
    try:
        kept = capture(rank, world, dist.group.WORLD)
        torch.save(kept, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
