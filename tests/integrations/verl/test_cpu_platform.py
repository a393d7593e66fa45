from __future__ import annotations

import torch

from verl_tlt.integrations.verl.cpu_platform import CPUDeviceId, PlatformCPU


def test_device_id_is_cpu_for_torch_and_zero_in_strings():
    device = CPUDeviceId()
    assert torch.zeros(1).to(device=device).device.type == "cpu"
    assert f"cuda:{device}" == "cuda:0" and int(device) == 0


def test_platform_reports_a_single_gloo_cpu_device():
    platform = PlatformCPU()
    assert platform.device_name == "cpu" and platform.device_count() == 1
    assert platform.communication_backend_name() == "gloo"
    assert platform.ray_resource_options(0.5) == {"num_gpus": 0.5}
    module = platform.device_module
    assert module.is_available() and module.device_count() == 1
    assert module.max_memory_allocated() == 0
    free, total = module.mem_get_info()
    assert 0 < free <= total
    state = module.get_rng_state()
    module.set_rng_state(state)


def test_duplicate_backend_string_is_collapsed_for_gloo(monkeypatch):
    import torch.distributed as dist

    PlatformCPU()
    assert getattr(dist.init_process_group, "_verl_tlt_patched", False)  # the platform installed its wrapper
    seen = {}

    def fake(*args, **kwargs):
        seen.update(kwargs)

    monkeypatch.setattr(dist.init_process_group, "__wrapped__", fake, raising=False)
    monkeypatch.setattr("torch.distributed.init_process_group", _rewrap(fake))
    dist.init_process_group(backend="cpu:gloo,cpu:gloo")
    assert seen["backend"] == "gloo"


def _rewrap(fake):
    # Re-apply the platform's wrapper around a fake so no real process group is created.
    import torch.distributed as dist

    from verl_tlt.integrations.verl import cpu_platform

    saved = dist.init_process_group
    dist.init_process_group = fake
    try:
        cpu_platform._patch_init_process_group()
        return dist.init_process_group
    finally:
        dist.init_process_group = saved
