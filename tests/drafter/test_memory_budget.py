"""The drafter worker's memory budget: its size, and which errors count as running out of memory."""

from __future__ import annotations

import torch

from verl_tlt.drafter.memory_budget import GIB, MemoryBudget, budget_bytes, is_out_of_memory, resident_bytes


def test_the_budget_is_the_configured_gib_or_a_share_of_the_node():
    assert budget_bytes(1.5) == int(1.5 * GIB)
    assert budget_bytes(0.0, node_bytes=20 * GIB) == int(3 * GIB)


def test_exceeded_compares_the_resident_size_with_the_limit():
    assert MemoryBudget(100, resident=lambda: 101).exceeded()
    assert not MemoryBudget(100, resident=lambda: 100).exceeded()
    assert resident_bytes() > 0 and not MemoryBudget(1 << 50).exceeded()  # the real process, a huge budget


def test_out_of_memory_errors_are_recognised():
    assert is_out_of_memory(MemoryError()) and is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(
        RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate; out of memory")
    )
    assert not is_out_of_memory(RuntimeError("shape mismatch")) and not is_out_of_memory(ValueError("out of memory"))
