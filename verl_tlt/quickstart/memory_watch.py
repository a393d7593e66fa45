"""Peak memory of a verl job per component: the driver, each kind of Ray actor, and Ray's own daemons.

A verl job on one machine is a tree of processes: the driver started by `run_verl_job`, the Ray daemons it starts
(gcs_server, raylet, dashboard, ...) and the Ray workers the raylet starts, each titled `ray::<ActorClass>` once it
holds an actor (`ray::WorkerDict` holds verl's actor/reference, `ray::DrafterWorker` a TLT drafter, ...). Sampling the
tree every few seconds and summing each component's PSS (shared pages split between the processes that map them, so
torch's libraries are not counted once per process, and the components' peaks are comparable) gives what each part
costs, and the node's used memory at the same samples gives what the job leaves free. Peaks between two samples are
missed: these are lower bounds, good for comparing two runs sampled alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DRIVER = "driver"
# The process that started the job (the quickstart itself): not part of the job, but it shares the machine with it.
CALLER = "caller"
RAY_SYSTEM = "ray (system)"
RAY_IDLE = "ray (idle workers)"
GIB = 1024**3


def component_of(cmdline: Sequence[str], is_root: bool) -> str:
    """The component a process of the job belongs to, from its command line (a Ray worker's title is argv[0])."""
    if is_root:
        return DRIVER
    head = cmdline[0] if cmdline else ""
    if not head.startswith("ray::"):
        return RAY_SYSTEM
    # "ray::WorkerDict.actor_rollout_generate_sequences" while a method runs, "ray::WorkerDict" between calls, and a
    # named actor's "ray::torch_server_0_0:TorchRolloutServer": the class is the component.
    title = head.removeprefix("ray::").split(" ")[0]
    actor = title.rsplit(":", 1)[-1].split(".")[0]
    return RAY_IDLE if actor in ("", "IDLE") else actor


@dataclass(frozen=True)
class ComponentPeak:
    """One component's largest footprint over the samples."""

    name: str
    peak_bytes: int  # the largest sum of its processes' PSS at one sample
    largest_process_bytes: int  # the largest single process's PSS at any sample
    processes: int  # the most of its processes alive at one sample

    def as_dict(self) -> dict:
        return {
            "component": self.name,
            "peak_gib": round(self.peak_bytes / GIB, 3),
            "largest_process_gib": round(self.largest_process_bytes / GIB, 3),
            "processes": self.processes,
        }


class PeakTracker:
    """Per-component peaks over samples of (component, bytes) pairs; pure, so tests feed it samples directly."""

    def __init__(self) -> None:
        self._peaks: dict[str, ComponentPeak] = {}
        self.node_peak_used_bytes = 0
        self.samples = 0

    def add(self, processes: Iterable[tuple[str, int]], node_used_bytes: int) -> None:
        totals: dict[str, list[int]] = {}
        for component, size in processes:
            totals.setdefault(component, []).append(size)
        for component, sizes in totals.items():
            old = self._peaks.get(component, ComponentPeak(component, 0, 0, 0))
            self._peaks[component] = ComponentPeak(
                component,
                max(old.peak_bytes, sum(sizes)),
                max(old.largest_process_bytes, max(sizes)),
                max(old.processes, len(sizes)),
            )
        self.node_peak_used_bytes = max(self.node_peak_used_bytes, node_used_bytes)
        self.samples += 1

    def peaks(self) -> list[ComponentPeak]:
        """Components, largest peak first."""
        return sorted(self._peaks.values(), key=lambda peak: -peak.peak_bytes)

    def report(self) -> dict:
        """JSON-ready: every component's peak, the node's peak used memory, and how many samples they rest on."""
        return {
            "components": [peak.as_dict() for peak in self.peaks()],
            "node_peak_used_gib": round(self.node_peak_used_bytes / GIB, 3),
            "samples": self.samples,
        }


class JobMemoryWatch:
    """Samples the process tree under `root_pid` (see the module docstring); call `sample()` every few seconds.

    caller_pid: also sample that process (the one that started the job) as the `caller` component, without its
    other children."""

    def __init__(self, root_pid: int, caller_pid: int | None = None) -> None:
        import psutil

        self._psutil = psutil
        self._root = psutil.Process(root_pid)
        self._caller = psutil.Process(caller_pid) if caller_pid is not None else None
        self.tracker = PeakTracker()

    def sample(self) -> None:
        psutil = self._psutil
        try:
            tree = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:  # the job has just exited
            return
        measured = []
        if self._caller is not None:
            try:
                measured.append((CALLER, self._caller.memory_full_info().pss))
            except psutil.Error:
                pass
        for process in tree:
            try:
                component = component_of(process.cmdline(), process.pid == self._root.pid)
                measured.append((component, process.memory_full_info().pss))
            except psutil.Error:  # exited between the listing and the read, or not ours to read
                continue
        memory = psutil.virtual_memory()
        self.tracker.add(measured, memory.total - memory.available)


def format_memory_table(reports: dict[str, dict], total_bytes: int | None = None) -> str:
    """Runs side by side: each component's peak PSS (GiB) per run, then the node's peak used memory."""
    runs = list(reports)
    components: list[str] = []
    for report in reports.values():
        components += [row["component"] for row in report["components"] if row["component"] not in components]
    width = max([len("component"), len("node used (peak)"), *map(len, components)])
    lines = [f"{'component':<{width}}  " + "  ".join(f"{run:>14}" for run in runs)]
    for component in components:
        cells = []
        for run in runs:
            row = next((r for r in reports[run]["components"] if r["component"] == component), None)
            cells.append(f"{row['peak_gib']:>10.2f} GiB" if row else f"{'-':>14}")
        lines.append(f"{component:<{width}}  " + "  ".join(cells))
    node = [f"{reports[run]['node_peak_used_gib']:>10.2f} GiB" for run in runs]
    lines.append(f"{'node used (peak)':<{width}}  " + "  ".join(node))
    if total_bytes:
        lines.append(
            f"(the node has {total_bytes / GIB:.1f} GiB; PSS sampled every few seconds, so peaks are lower bounds)"
        )
    return "\n".join(lines)
