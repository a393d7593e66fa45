"""Moving a frozen module to a training device and back without copying it back.

A drafter burst needs the target's embedding and LM head on the training device (at 7B: 4.4 GB in fp32), but it
never changes them. So the onload copies them there and keeps their host tensors, and the offload only points the
module back at those host tensors and drops the device copies: half the traffic of a move both ways. Unless the
weights were loaded anew while on the device (the module's `weights_generation` moved): then they are copied back.
"""

from __future__ import annotations

import torch
from torch import nn


class FrozenOnload:
    """`module` on `device` from construction until `offload()`, its host tensors kept meanwhile."""

    def __init__(self, module: nn.Module, device: torch.device | str):
        self.module = module
        # Per owner and attribute; a tied weight has two owners and one host tensor (one `.data` per tensor object).
        data: dict[int, torch.Tensor] = {}
        self.host = {
            (owner, key, kind): data.setdefault(id(tensor), tensor.data)
            for owner, sub in module.named_modules(remove_duplicate=False)
            for kind, tensors in (("param", sub._parameters), ("buffer", sub._buffers))
            for key, tensor in tensors.items()
            if tensor is not None
        }
        self.generation = getattr(module, "weights_generation", None)
        module.to(device)

    def offload(self) -> None:
        """Back to the host tensors it had (copied back instead if its weights were loaded anew meanwhile)."""
        if getattr(self.module, "weights_generation", None) != self.generation:
            self.module.to("cpu")
            return
        restored: dict[int, torch.Tensor] = {}  # host tensor id -> what its owners get (one object for a tied weight)
        modules = dict(self.module.named_modules(remove_duplicate=False))
        for (owner, key, kind), host in self.host.items():
            sub = modules[owner]
            if kind == "buffer":
                sub._buffers[key] = host
                continue
            if id(host) not in restored:
                param = sub._parameters[key]
                if torch._has_compatible_shallow_copy_type(param, host):
                    param.data = host  # the same Parameter object: nothing that holds it goes stale
                else:  # e.g. from the meta device: a new Parameter, as nn.Module.to makes one
                    param = nn.Parameter(host, requires_grad=param.requires_grad)
                restored[id(host)] = param
            sub._parameters[key] = restored[id(host)]
