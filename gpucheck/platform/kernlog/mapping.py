"""PCI bus id -> GPU (index, UUID).

Sources, best first: the telemetry snapshot's GPU list (what `gpucheck run` already read through
NVML), NVML itself (for `gpucheck xid`, read lazily), and the driver's own announcement lines
``NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-...`` (UUID only: the driver's numbering is not
nvidia-smi's index). Bus ids are the short ``dddd:bb:dd`` form of Xid lines.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable

from ..pci import short_bus_id
from .parse import GpuAnnouncement

if TYPE_CHECKING:  # pragma: no cover
    from ..telemetry.model import Snapshot


@dataclass(frozen=True)
class GpuInfo:
    pci_bus_id: str
    index: int | None = None
    uuid: str | None = None
    serial: str | None = None
    name: str | None = None

    def label(self) -> str:
        return f"GPU {self.index}" if self.index is not None else f"PCI {self.pci_bus_id}"


class GpuMap:
    def __init__(self, gpus: Iterable[GpuInfo] = (), source: str | None = None):
        self.by_bus: dict[str, GpuInfo] = {g.pci_bus_id: g for g in gpus}
        self.source = source

    def __len__(self) -> int:
        return len(self.by_bus)

    def lookup(self, bus: str | None) -> GpuInfo | None:
        return self.by_bus.get(bus) if bus else None

    def gpus(self) -> list[GpuInfo]:
        return sorted(self.by_bus.values(),
                      key=lambda g: (g.index is None, g.index if g.index is not None else 0, g.pci_bus_id))

    def merged_with(self, other: "GpuMap") -> "GpuMap":
        """This map, with what it lacks (UUIDs, serials, whole GPUs) taken from `other`."""
        out = dict(self.by_bus)
        for bus, g in other.by_bus.items():
            mine = out.get(bus)
            if mine is None:
                out[bus] = g
            else:
                out[bus] = replace(
                    mine,
                    index=mine.index if mine.index is not None else g.index,
                    uuid=mine.uuid or g.uuid,
                    serial=mine.serial or g.serial,
                    name=mine.name or g.name,
                )
        sources = [s for s in (self.source, other.source) if s]
        return GpuMap(out.values(), "+".join(sources) if sources else None)


def from_snapshot(snapshot: "Snapshot | None") -> GpuMap:
    gpus = []
    entries = snapshot.get("gpus") if snapshot else None
    for g in entries or []:
        bus = short_bus_id(str(g.get("pci_bus_id") or ""))
        if bus is None:
            continue
        idx = g.get("index")
        gpus.append(GpuInfo(bus, int(idx) if isinstance(idx, int) else None,
                            g.get("uuid"), g.get("serial"), g.get("name")))
    return GpuMap(gpus, "snapshot" if gpus else None)


def from_announcements(anns: dict[str, GpuAnnouncement]) -> GpuMap:
    gpus = [GpuInfo(bus, None, a.uuid, a.serial) for bus, a in anns.items()]
    return GpuMap(gpus, "driver-log" if gpus else None)


def from_nvml() -> tuple[GpuMap, str | None]:
    """GPUs as NVML enumerates them; (empty map, why) when NVML cannot be used. Never raises."""
    try:
        from ..telemetry.nvml import NvmlSession, text
    except Exception as e:  # noqa: BLE001 - an import problem is a reason, not a crash
        return GpuMap(), f"NVML unavailable: {e}"
    s = NvmlSession()
    try:
        if not s.ok:
            return GpuMap(), f"NVML unavailable: {s.error}"
        n = s.device_count()
        if n is None:
            return GpuMap(), "NVML could not count the GPUs"
        gpus = []
        for i in range(n):
            h, err = s.read("nvmlDeviceGetHandleByIndex", i)
            if err:
                continue
            pci, err = s.read("nvmlDeviceGetPciInfo", h)
            if err or pci is None:
                continue
            bus = short_bus_id(text(getattr(pci, "busId", b"")))
            if bus is None:
                continue
            uuid, _ = s.read("nvmlDeviceGetUUID", h)
            serial, _ = s.read("nvmlDeviceGetSerial", h)
            name, _ = s.read("nvmlDeviceGetName", h)
            gpus.append(GpuInfo(bus, i, text(uuid) if uuid is not None else None,
                                text(serial) if serial is not None else None,
                                text(name) if name is not None else None))
        return GpuMap(gpus, "nvml"), None
    finally:
        s.close()
