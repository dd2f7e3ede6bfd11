"""FakeTelemetry: a telemetry source made of data handed in, for tests and demonstrations.

    FakeTelemetry(snapshot=snap,                      # what snapshot() returns (default: no GPUs)
                  samples=lambda gpu: {...},          # a load sample per GPU and tick (NvmlSession.sample keys)
                  xids=lambda: [(gpu, xid), ...],     # Xid events per tick
                  processes={0: GpuProcesses(0, ...)})  # or a callable(indices) -> {index: GpuProcesses}

Without `samples` it has no load telemetry; without `xids` Xid events are not watched; without
`processes`, or for a GPU a `processes` mapping does not name, a GPU is idle (no process), so that
a test loads it unless it says otherwise (a `processes` callable answers for itself: a GPU it
leaves out is "no answer", unreadable).
It is a source like the others: a check cannot tell it from NVML except by what it says in its
evidence ("telemetry from a fake telemetry source").
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from . import nvml as N
from .model import KIND, VERSION, Sample, Snapshot

SampleFn = Callable[[int], "Sample | Mapping[str, Any] | None"]
ProcessesFn = Callable[[list[int]], Mapping[int, N.GpuProcesses]]


def empty_snapshot() -> Snapshot:
    return {"kind": KIND, "version": VERSION, "synthetic": True, "source": "synthetic: a fake telemetry source",
            "host": "fake", "captured_at": "1970-01-01T00:00:00Z", "nvml": {"ok": True, "error": None},
            "driver_version": None, "cuda_driver_version": None, "nvml_version": None, "pci_nvidia_devices": [],
            "gpus": []}


class FakeSampling:
    """A SamplingSession over the fake's data."""

    def __init__(self, fake: "FakeTelemetry", watch_xid: bool):
        self.fake = fake
        self.note = None if fake.samples is not None else "no telemetry: the fake telemetry source has no samples"
        self.xid_note = None if fake.xids is not None or not watch_xid else \
            "Xid events not watched during the load: the fake telemetry source has none"
        self._watch = watch_xid and fake.xids is not None

    def sample(self, gpu: int) -> Sample | None:
        if self.fake.samples is None:
            return None
        got = self.fake.samples(gpu)
        if got is None:
            return None
        base: Sample = {"index": gpu, "sm_clock_mhz": None, "temperature_c": None, "power_w": None,
                        "throttle_reasons": None, "throttle_reason_names": None, "error": None, "time": time.time()}
        base.update(got)  # type: ignore[typeddict-item]
        return base

    def poll_xid(self) -> list[tuple[int, int]] | None:
        if not self._watch or self.fake.xids is None:
            return None
        return [(int(g), int(x)) for g, x in self.fake.xids()]

    def close(self) -> None:
        pass


class FakeTelemetry:
    """See the module."""

    kind = "fake"
    description = "a fake telemetry source"

    def __init__(self, snapshot: Snapshot | Mapping[str, Any] | None = None, *, samples: SampleFn | None = None,
                 xids: Callable[[], Sequence[tuple[int, int]]] | None = None,
                 processes: ProcessesFn | Mapping[int, N.GpuProcesses] | None = None,
                 verdict_kind: str = "live"):
        self._snapshot = snapshot
        self.samples = samples
        self.xids = xids
        self.processes = processes
        self.verdict_kind = verdict_kind
        self.reads = 0  # how many times snapshot() was called

    def snapshot(self, timeout_s: float | None = None) -> Snapshot:
        self.reads += 1
        snap: Snapshot = copy.deepcopy(self._snapshot) if self._snapshot is not None else empty_snapshot()  # type: ignore[assignment]
        return snap

    def unread(self, kind: str, message: str) -> Snapshot:
        from .snapshot import unread

        base = self.snapshot()
        return unread(base, kind, message)

    def abandon(self, thread: threading.Thread) -> None:
        """Nothing to shut down: the fake has no NVML."""

    def sampling(self, gpus: Sequence[int], watch_xid: bool = True) -> FakeSampling:
        return FakeSampling(self, watch_xid)

    def watches(self, device: str) -> bool:
        return self.samples is not None

    def gpu_processes(self, indices: Sequence[int], cancel: threading.Event | None = None) -> Mapping[int, Any]:
        wanted = list(indices)
        if self.processes is None:
            return {i: N.GpuProcesses(i, ()) for i in wanted}
        if callable(self.processes):
            return dict(self.processes(wanted))
        return {i: self.processes.get(i, N.GpuProcesses(i, ())) for i in wanted}
