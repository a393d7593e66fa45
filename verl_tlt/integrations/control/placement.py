"""Where a drafter worker trains: the accelerator of the rollout replica whose drain frees it, or the host CPU.

Each worker is an extra Ray actor beside its replica's server, not a part of verl's worker that owns the GPU (the
TLT reference's choice). It sees the replica's GPU the way verl's own vLLM servers see theirs: verl's placement
group already holds every GPU, so the actor asks Ray for none, and sets ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``
(Ray then leaves the device list alone) and ``CUDA_VISIBLE_DEVICES`` to the replica's first device, where it trains
as ``cuda:0``. Why an actor of its own: it needs no change to verl's worker classes (what verl's maintainers can
take), it is the same actor on the torch and the vLLM rollout and on CPU, and a drafter that crashes or runs out of
memory takes down its own process only, never the actor or rollout worker that owns the GPU. The cost: a second
CUDA context on that GPU (a few hundred MiB), and the drained engine must free memory for it first
(``free_for_training`` in the control contract). A replica spanning several GPUs (tensor parallel) trains the
one-layer drafter on its first GPU only.

On CPU a replica's "accelerator" is its share of the node's cores. Each torch rollout server pins itself to an
equal, contiguous share (`replica_cpu_cores`: replica i of n on a node with c cores gets cores [i*c/n, (i+1)*c/n)),
and its drafter worker is pinned to the same cores, so a burst on a drained replica trains on that replica's cores
only and never slows a replica still decoding (the OS would otherwise run it wherever a core looked free, the
decoding one included). The CPU quickstart's layout, 2 replicas on 2 cores, gives each replica and its worker one
core. With fewer cores than replicas, replica i shares core i mod c with the others mapped there: pinned, but no
longer alone. A CPU worker also runs in the OS's idle scheduling class (`tlt.drafter.cpu_idle_class`): verl's own
processes (agent loop, Ray), which no one pins, then find the drained core free when they wake, instead of crowding
the core a replica still decodes on. The actor's update runs while the replicas sleep and their workers idle (a
worker works only in a burst), so neither competes with it.

Pure: no Ray, no torch; the runtime passes what the replica's server reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from verl_tlt.config import ROOT_KEY

DEVICE_KEY = f"{ROOT_KEY}.drafter.device"
DEVICE_SETTINGS = ("auto", "cpu", "cuda")
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
NOSET_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class WorkerPlacement:
    """The device a drafter worker trains on and the environment its actor starts with."""

    device: str  # "cpu" or "cuda:0" (the first of the devices the environment makes visible)
    env_vars: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        if not self.env_vars:
            return self.device
        return f"{self.device} ({VISIBLE_DEVICES}={self.env_vars[VISIBLE_DEVICES]})"


def place_worker(setting: str, replica_devices: Sequence[str], replica_rank: int) -> WorkerPlacement:
    """Where the drafter worker of rollout replica `replica_rank` trains.

    setting: ``tlt.drafter.device`` (auto: the replica's GPU if it has one, else the CPU; cpu; cuda: the replica's
    GPU, an error if it has none). replica_devices: the GPU ids the replica's server runs on (its
    ``CUDA_VISIBLE_DEVICES`` entries on its node; empty for a CPU replica).
    """
    if setting not in DEVICE_SETTINGS:
        raise ValueError(f"{DEVICE_KEY}={setting!r} is not one of {list(DEVICE_SETTINGS)}; e.g. {DEVICE_KEY}=auto")
    devices = [str(device).strip() for device in replica_devices if str(device).strip()]
    if setting == "cpu" or (setting == "auto" and not devices):
        return WorkerPlacement("cpu")
    if not devices:
        raise ValueError(
            f"{DEVICE_KEY}=cuda, but rollout replica {replica_rank} runs on no GPU (a CPU rollout), so its drafter "
            f"worker has no accelerator to train on. Fix: {DEVICE_KEY}=auto (the CPU where a replica has no GPU) or "
            f"{DEVICE_KEY}=cpu."
        )
    return WorkerPlacement("cuda:0", {VISIBLE_DEVICES: devices[0], NOSET_VISIBLE_DEVICES: "1"})


def visible_devices(environ_value: str | None) -> list[str]:
    """The device ids in a ``CUDA_VISIBLE_DEVICES`` value (none when unset or empty)."""
    return [part.strip() for part in (environ_value or "").split(",") if part.strip()]


def replica_cpu_cores(available: Sequence[int], index: int, count: int) -> list[int]:
    """The cores of replica `index` of the `count` rollout replicas on a node whose processes may run on `available`:
    an equal, contiguous share each (the last ones take the remainder); with fewer cores than replicas, the single
    core `available[index % len(available)]`, shared."""
    cores = sorted(set(available))
    if not cores:
        raise ValueError("replica_cpu_cores needs at least one available core")
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"replica index {index} is not one of {count} replicas on the node")
    if len(cores) < count:
        return [cores[index % len(cores)]]
    return cores[index * len(cores) // count : (index + 1) * len(cores) // count]
