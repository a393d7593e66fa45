"""Where a vLLM replica exchanges drafter files: /dev/shm only when it has room (pure; no vLLM needed)."""

from __future__ import annotations

import torch

from verl_tlt.bench.engine_bench import BenchModel, qwen2_config
from verl_tlt.integrations.vllm.drafter_files import exchange_base, exchange_bytes


def _config(vocab: int, hidden: int, tied: bool, dtype=torch.bfloat16):
    config = qwen2_config(BenchModel("exchange", hidden, 2, 4, 2, 2 * hidden, vocab, tie_word_embeddings=tied))
    config.dtype = dtype
    return config


def test_the_exchange_holds_the_policy_head_in_its_dtype_and_three_fp32_drafters():
    tied, untied = exchange_bytes(_config(1000, 64, True)), exchange_bytes(_config(1000, 64, False))
    assert untied - tied == 1000 * 64 * 2  # an untied LM head doubles the shared part, 2 bytes a bf16 weight
    shared_fp32 = exchange_bytes(_config(1000, 64, True, torch.float32)) - tied
    assert shared_fp32 == 1000 * 64 * 2  # fp32 weights take twice the bytes
    assert tied > 1000 * 64 * 2 + 3 * 4 * (2 * 64 * 64)  # ... plus three drafters, fc (2h x h) at least


def test_an_eagle3_exchange_counts_its_own_head_and_wider_fc():
    eagle = exchange_bytes(_config(1000, 64, True))
    eagle3 = exchange_bytes(_config(1000, 64, True), "eagle3", draft_vocab_size=500)
    # Three fp32 exports, each with 500 head rows and an fc over three layers instead of two, and 2H-wide q/k/v.
    assert eagle3 - eagle >= 3 * 4 * (500 * 64 + 64 * 64)
    assert exchange_bytes(_config(1000, 64, True), "eagle3", draft_vocab_size=5000) > eagle3  # capped at the vocab


def test_shm_is_used_only_when_writable_and_roomy(tmp_path):
    shm, fallback = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    base, why = exchange_base(100, shm=shm, fallback=fallback, free_bytes=lambda _: 1000)
    assert base == shm and "needed" in why
    base, why = exchange_base(64 << 20, shm=shm, fallback=fallback, free_bytes=lambda _: 32 << 20)
    assert base == fallback and "MiB free, the drafter exchange needs 64 MiB" in why  # Docker's default /dev/shm
    base, why = exchange_base(1, shm=tmp_path / "missing", fallback=fallback)
    assert base == fallback and "not a writable directory" in why
