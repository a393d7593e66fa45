"""Whether drafter training runs under bf16 autocast on a device: decided by a real call, once per device.

bf16 halves the bytes every product moves and doubles the tensor-core rate on GPUs, and the drafter's fp32 weights
stay the optimizer's masters (autocast casts per op). On a CPU, bf16 products are fast only with AMX or AVX512-BF16
and fall back to slow emulation elsewhere, and a rounding change there buys little; so CPUs train in fp32. A CUDA
device trains in bf16 when a bf16 product under autocast runs and is exact on small integers (a device or build
without bf16 fails the call or the check), else in fp32.
"""

from __future__ import annotations

import functools
import logging

import torch

logger = logging.getLogger(__name__)


def autocast_dtype(device: torch.device | str) -> torch.dtype | None:
    """torch.bfloat16 where drafter training should autocast on `device`, None for plain fp32."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.bfloat16 if _cuda_runs_bf16(index) else None


@functools.cache
def _cuda_runs_bf16(index: int) -> bool:
    device = torch.device("cuda", index)
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            a = torch.arange(64, device=device, dtype=torch.float32).view(8, 8) % 5
            product = a @ a
        exact = product.dtype == torch.bfloat16 and bool((product.float() == a @ a).all())
    except RuntimeError as error:
        logger.info("Drafter training on %s stays in fp32: a bf16 product failed (%s)", device, error)
        return False
    if not exact:
        logger.info("Drafter training on %s stays in fp32: a bf16 product was not exact on small integers", device)
    return exact
