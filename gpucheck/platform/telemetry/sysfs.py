"""What the kernel sees on the PCI bus, independent of the NVIDIA driver.

`nvidia_pci_devices(root)` lists NVIDIA (vendor 0x10de) display controllers: class 0x0300xx (VGA)
and 0x0302xx (3D controller, the class of data-centre GPUs). NVSwitches (class 0x0680xx) and the
GPUs' audio functions (0x0403xx) are left out. A GPU that the kernel enumerates but NVML does not
report is a GPU the driver failed to bring up; a GPU that left the bus shows in neither, which is
why `[node] expected_gpus` exists.
"""

from __future__ import annotations

import os
from pathlib import Path
from ..pci import normalize_bus_id
from .model import PciDevice

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)  # class >> 8: VGA compatible, 3D controller


def _read_hex(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="ascii").strip(), 16)
    except (OSError, ValueError):
        return None


def nvidia_pci_devices(sysfs_root: str | os.PathLike[str] = "/sys") -> list[PciDevice]:
    """NVIDIA GPUs on the PCI bus, sorted by bus id:
    [{"bus_id": "0000:18:00.0", "class": "0x030200", "device": "0x2330", "driver": "nvidia"|None}]."""
    base = Path(sysfs_root) / "bus" / "pci" / "devices"
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return []
    found: list[PciDevice] = []
    for name in entries:
        dev = base / name
        if _read_hex(dev / "vendor") != NVIDIA_VENDOR:
            continue
        cls = _read_hex(dev / "class")
        if cls is None or (cls >> 8) not in GPU_CLASSES:
            continue
        bus_id = normalize_bus_id(name)
        if bus_id is None:
            continue
        device = _read_hex(dev / "device")
        driver = None
        try:
            driver = os.path.basename(os.readlink(dev / "driver"))
        except OSError:
            pass
        found.append(
            {
                "bus_id": bus_id,
                "class": f"{cls:#08x}",
                "device": None if device is None else f"{device:#06x}",
                "driver": driver,
            }
        )
    return sorted(found, key=lambda d: d["bus_id"])
