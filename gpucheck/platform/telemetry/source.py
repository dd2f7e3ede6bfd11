"""One telemetry source per run: where the snapshot, the load samples, the Xid events and the GPUs'
running processes come from. Chosen at the edge (gpucheck.app: a recorded snapshot, else live
NVML; a library caller or a test may hand its own) and carried in the check Context
(`ctx.telemetry`); checks, the sampler and the busy guard never choose one.

- `LiveTelemetry`: this node's NVML (gpucheck.platform.telemetry.nvml) and sysfs.
- `ReplayTelemetry`: a recorded snapshot, answered through the same readers by a replay backend
  (gpucheck.platform.telemetry.replay).
- `FakeTelemetry` (gpucheck.platform.telemetry.fake): data handed in by tests.

A source never raises for NVML trouble: what could not be read says why (the snapshot's nvml.ok
and errors, a sampling session's `note`, a GpuProcesses' `failure`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Protocol

from . import nvml as N
from .model import Sample, Snapshot

READ_TIMEOUT_S = 15.0  # reading the GPUs' processes: past this, "could not read" (a hung driver)


class SamplingSession(Protocol):
    """Telemetry of the GPUs under load, opened by the sampler's thread. `note`: why there is no
    telemetry at all (then nothing else is called); `xid_note`: why Xid events are not watched."""

    note: str | None
    xid_note: str | None

    def sample(self, gpu: int) -> Sample | None: ...

    def poll_xid(self) -> list[tuple[int, int]] | None:
        """(GPU, Xid) of the events since the last poll; None when Xid events are not watched."""

    def close(self) -> None: ...


class TelemetrySource(Protocol):
    """Where a run's telemetry comes from."""

    kind: str  # "live", "replay" or "fake"
    verdict_kind: str  # the verdict's source.kind: "live" or "snapshot"
    description: str  # for evidence: "NVML", "the recorded snapshot", ...

    def snapshot(self, timeout_s: float | None = None) -> Snapshot:
        """Everything the level-1 checks judge, read now (`timeout_s`: a driver that does not
        answer in time gives nvml.ok false)."""

    def unread(self, kind: str, message: str) -> Snapshot:
        """A snapshot for telemetry that could not be read at all (a hung driver, a signal):
        nvml.ok false with this failure, and what is known without NVML."""

    def abandon(self, thread: threading.Thread) -> None:
        """A read of this source (made by daemon `thread`) did not answer in time and the thread
        is left behind: while it is stuck, never shut its NVML down at exit (that would wait for
        the same hung driver)."""

    def sampling(self, gpus: Sequence[int], watch_xid: bool = True) -> SamplingSession:
        """A session that samples `gpus` under load (opened in the sampler's thread)."""

    def watches(self, device: str) -> bool:
        """Whether this source has load telemetry for workers on `device` ("cuda", "cpu")."""

    def gpu_processes(self, indices: Sequence[int], cancel: threading.Event | None = None) -> Mapping[int, Any]:
        """{index: telemetry.nvml.GpuProcesses} for every index; never raises or hangs."""


# -- NVML-backed (live, replay) ---------------------------------------------------------------------------
class NvmlSampling:
    """A SamplingSession over an NvmlSession: its cheap `sample()` and an Xid event watch."""

    def __init__(self, session: N.NvmlSession, gpus: Sequence[int], watch_xid: bool):
        self.session = session
        self.note = None if session.ok else f"no NVML telemetry: {session.error}"
        self.xid_note: str | None = None
        self._xid: N.XidWatch | None = None
        if session.ok and watch_xid:
            self._xid = N.XidWatch(session, list(gpus))
            self.xid_note = self._xid.note

    def sample(self, gpu: int) -> Sample:
        return self.session.sample(gpu)

    def poll_xid(self) -> list[tuple[int, int]] | None:
        if self._xid is None or not self._xid.ok:
            return None
        events = self._xid.poll()
        self.xid_note = self._xid.note
        return events

    def close(self) -> None:
        if self._xid is not None:
            self._xid.close()
        self.session.close()


def bounded(fn: Callable[[], Any], timeout_s: float, cancel: threading.Event | None,
            what: str = "reading the GPU's processes", library: N.Library | None = None) -> tuple[Any, str | None]:
    """fn() in a daemon thread: (value, None), or (None, why) when it raised, did not answer within
    timeout_s, or `cancel` was set meanwhile. A call that did not answer is left behind (a daemon
    thread cannot hold the process's exit) and its `library` is abandoned (never shut down at
    exit: that would wait for the same hung driver)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except Exception as e:  # noqa: BLE001 - the readers map NVML errors themselves; this is a bug
            box["error"] = f"{type(e).__name__}: {e}"

    th = threading.Thread(target=target, name="gpucheck-nvml-processes", daemon=True)
    th.start()
    end = time.monotonic() + timeout_s
    while th.is_alive() and time.monotonic() < end:
        if cancel is not None and cancel.is_set():
            return None, f"interrupted while {what}"
        th.join(0.1)
    if th.is_alive():
        (library or N.live_library()).abandon(th)
        return None, f"NVML did not answer within {timeout_s:g} s (driver hang?)"
    if "error" in box:
        return None, f"{what} failed: {box['error']}"
    return box["value"], None


def read_processes(library: N.Library | None, indices: Sequence[int], *, timeout_s: float = READ_TIMEOUT_S,
                   cancel: threading.Event | None = None) -> dict[int, N.GpuProcesses]:
    """{index: GpuProcesses} for every index through `library` (None: live NVML), never raising
    or hanging."""

    def read_all() -> dict[int, N.GpuProcesses]:
        with N.NvmlSession(library) as s:
            return {i: N.read_gpu_processes(s, i) for i in indices}

    value, why = bounded(read_all, timeout_s, cancel, library=library)
    if why is not None:
        return {i: N.GpuProcesses(i, None, N.NvmlFailure(N.OTHER, why)) for i in indices}
    done: dict[int, N.GpuProcesses] = value
    return done


class LiveTelemetry:
    """This node's NVML and sysfs."""

    kind = "live"
    verdict_kind = "live"
    description = "NVML"

    def __init__(self, sysfs_root: str | os.PathLike[str] = Path("/sys"), *,
                 process_timeout_s: float = READ_TIMEOUT_S):
        self.sysfs_root = Path(sysfs_root)
        self.process_timeout_s = process_timeout_s

    def snapshot(self, timeout_s: float | None = None) -> Snapshot:
        from .snapshot import collect_snapshot

        return collect_snapshot(self.sysfs_root, timeout_s=timeout_s)

    def unread(self, kind: str, message: str) -> Snapshot:
        from .snapshot import unreadable_snapshot

        return unreadable_snapshot(kind, message, self.sysfs_root)

    def abandon(self, thread: threading.Thread) -> None:
        N.live_library().abandon(thread)

    def sampling(self, gpus: Sequence[int], watch_xid: bool = True) -> SamplingSession:
        return NvmlSampling(N.NvmlSession(), gpus, watch_xid)

    def watches(self, device: str) -> bool:
        return device == "cuda"

    def gpu_processes(self, indices: Sequence[int], cancel: threading.Event | None = None) -> Mapping[int, Any]:
        return read_processes(None, indices, timeout_s=self.process_timeout_s, cancel=cancel)


class ReplayTelemetry:
    """A recorded snapshot, replayed through the live readers (gpucheck.platform.telemetry.replay). It is
    not this node: it has no load telemetry for workers, and no running processes are recorded
    (they read as not in this capture)."""

    kind = "replay"
    verdict_kind = "snapshot"
    description = "the recorded snapshot"

    def __init__(self, doc: Snapshot | Mapping[str, Any]):
        from .replay import replay_library

        self.doc = doc
        self.library = replay_library(doc)

    def snapshot(self, timeout_s: float | None = None) -> Snapshot:
        from .replay import replay_snapshot

        return replay_snapshot(self.doc, self.library)

    def unread(self, kind: str, message: str) -> Snapshot:
        from .replay import recorded_facts
        from .snapshot import unread

        return unread(recorded_facts(self.doc), kind, message)

    def abandon(self, thread: threading.Thread) -> None:
        self.library.abandon(thread)

    def sampling(self, gpus: Sequence[int], watch_xid: bool = True) -> SamplingSession:
        return NvmlSampling(N.NvmlSession(self.library), gpus, watch_xid)

    def watches(self, device: str) -> bool:
        return False

    def gpu_processes(self, indices: Sequence[int], cancel: threading.Event | None = None) -> Mapping[int, Any]:
        return read_processes(self.library, indices, cancel=cancel)


class CaptureTelemetry(ReplayTelemetry):
    """An `nvidia-smi -q`/`-q -x` capture converted to the snapshot model by its own reader
    (gpucheck.platform.telemetry.nvsmi), judged as converted. It is not a recording of NVML calls: a
    capture often holds part of what one NVML call returns (a "Remapped Rows" section without
    "Remapping Failure Occurred"), which an NVML replay could only refuse whole, losing the part it
    does show (a pending remap). The converter already marks what the capture lacks as
    `not_in_capture`."""

    description = "the nvidia-smi capture"

    def snapshot(self, timeout_s: float | None = None) -> Snapshot:
        converted: Snapshot = self.doc  # type: ignore[assignment]
        return converted


def is_capture(doc: Mapping[str, Any]) -> bool:
    """Whether a loaded snapshot was converted from an nvidia-smi capture."""
    capture = doc.get("capture")
    return isinstance(capture, Mapping) and str(capture.get("format", "")).startswith("nvidia-smi")


def live() -> LiveTelemetry:
    """The default source of a Context made without one: this node's NVML."""
    return LiveTelemetry()
