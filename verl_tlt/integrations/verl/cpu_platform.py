"""A verl platform for machines without an accelerator (verl 0.9.1 has none).

Registered as `cpu` in verl's PlatformRegistry. verl's auto-detection tries the built-in platforms first
(nvidia, npu, rocm), so this one is chosen only when none of them is present, or explicitly with
VERL_PLATFORM=cpu. Ray is started with fake GPU resources (see verl_tlt/hydra_conf/cpu/torch.yaml), so the
platform keeps verl's "GPU" Ray resource name and one "device" per worker.

Two fixes here reach beyond the platform interface, because verl hard-codes accelerator assumptions:
- verl builds the process-group backend as f"cpu:gloo,{device}:{backend}", which is "cpu:gloo,cpu:gloo" here
  and rejected by torch; `_patch_init_process_group` collapses duplicate device entries.
- verl registers its FSDP engines only for devices "cuda"/"npu"; they run fine on CPU, so the engine lookup
  is pointed at the CUDA registration via verl's own VERL_ENGINE_DEVICE override.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import types
from typing import Any

import psutil
import torch
from verl.plugin.platform.platform_base import PlatformBase

logger = logging.getLogger(__name__)


class CPUDeviceId(str):
    """The current "device": equal to "cpu" for torch (`.to(device)`), formats as "0" in f"{device}:{id}" strings.

    verl mixes both uses of get_device_id(): `model.to(device=get_device_id())` and f"cuda:{get_device_id()}".
    """

    def __new__(cls) -> CPUDeviceId:
        return super().__new__(cls, "cpu")

    def __format__(self, spec: str) -> str:
        return format(0, spec)

    def __int__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0


class CPUDeviceModule(types.ModuleType):
    """A torch.cuda-shaped module for CPU: one always-available device, no-op memory management."""

    def __init__(self) -> None:
        super().__init__("verl_tlt_cpu_device")

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> CPUDeviceId:
        return CPUDeviceId()

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def is_bf16_supported(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def get_device_name(self, device: Any = None) -> str:
        return "cpu"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if "memory" in name or name.startswith(("max_", "reset_")):
            return _zero  # memory statistics: nothing is tracked on CPU
        return _noop


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def accelerator_present() -> bool:
    """True when torch or the system shows a CUDA/ROCm/NPU device, in which case verl's own platforms apply."""
    if torch.cuda.is_available() or (hasattr(torch, "npu") and torch.npu.is_available()):
        return True
    return any(shutil.which(cmd) for cmd in ("nvidia-smi", "rocm-smi", "npu-smi"))


def _patch_init_process_group() -> None:
    """Make torch accept verl's "cpu:gloo,cpu:gloo" backend string (duplicate device entries)."""
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_verl_tlt_patched", False):
        return
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any):
        backend = kwargs.get("backend")
        if isinstance(backend, str) and "," in backend:
            entries = dict.fromkeys(part.strip() for part in backend.split(","))
            kwargs["backend"] = "gloo" if all(e.endswith(":gloo") for e in entries) else ",".join(entries)
        return original(*args, **kwargs)

    init_process_group._verl_tlt_patched = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


class PlatformCPU(PlatformBase):
    """verl platform for CPU-only machines (registered as "cpu")."""

    def __init__(self) -> None:
        super().__init__()
        _patch_init_process_group()
        # verl's FSDP engines are registered for "cuda"/"npu" only, but run on CPU unchanged.
        os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
        self._device_module = CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return not accelerator_present()

    def current_device(self) -> CPUDeviceId:  # type: ignore[override]
        return CPUDeviceId()

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register_cpu_platform() -> None:
    """Add PlatformCPU to verl's registry (idempotent)."""
    from verl.plugin.platform.platform_manager import PlatformRegistry

    if PlatformRegistry.get("cpu") is None:
        PlatformRegistry.register(platform="cpu")(PlatformCPU)
