"""Drafter training's precision: fp32 on a CPU, bf16 autocast (fp32 masters) where a CUDA device runs bf16."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.drafter.precision import autocast_dtype


def test_a_cpu_trains_in_fp32():
    assert autocast_dtype("cpu") is None


@pytest.mark.gpu
def test_a_cuda_step_autocasts_to_bf16_and_keeps_fp32_masters(varied_qwen2):
    from verl_tlt.config import DrafterConfig
    from verl_tlt.drafter.data import DrafterDataBuffer, DrafterSample
    from verl_tlt.drafter.model import EagleDrafterModel
    from verl_tlt.drafter.trainer import DrafterTrainer
    from verl_tlt.modeling.weights import load_pretrained

    target, _ = load_pretrained(str(varied_qwen2[0]), device="cuda")
    target.requires_grad_(False)
    model = EagleDrafterModel.from_target(target)
    trainer = DrafterTrainer(model, DrafterDataBuffer(10_000), DrafterConfig(max_tokens_per_batch=256))
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(40, target.spec.hidden_size, generator=generator)
    ids = torch.randint(target.spec.vocab_size, (40,), generator=generator)
    trainer.add_samples([DrafterSample(ids, hidden, torch.arange(40) >= 4)])
    before = model.fc.weight.detach().clone()
    metrics = trainer.train(max_steps=2).last_metrics
    assert trainer.autocast == torch.bfloat16
    assert model.fc.weight.dtype == torch.float32 and not torch.equal(model.fc.weight, before)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
