"""PCIe AER counters from sysfs, and `lspci -vvv` link and AER status, as plain data.

`read_pcie_aer(sysfs_root)` records, for every GPU (NVIDIA class 0x0300/0x0302), NVSwitch (NVIDIA
class 0x0680), network controller (class 0x02xx) and each PCI bridge above them (their upstream
ports, found from the device's path under /sys/devices), the raw text of its
`aer_dev_correctable`, `aer_dev_nonfatal` and `aer_dev_fatal` files (Linux 4.17+; absent on a
device without the AER capability or a kernel without the files: None). A snapshot keeps these
texts (`pcie_aer`), and `parse_aer_counters` reads them, live and replayed alike.

`parse_lspci_vvv(text)` reads lspci's device blocks: the link's capability and status (speed,
width, "(downgraded)"), and the AER status registers' set bits (UESta: uncorrectable, CESta:
correctable; sticky since they were last cleared: a state, not a count).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TypedDict

from ..pci import normalize_bus_id

AER_FILES = ("correctable", "nonfatal", "fatal")  # aer_dev_<name>
TOTAL_KEYS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}
NVIDIA_VENDOR = 0x10DE
_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class AerDeviceRecord(TypedDict):
    """One device as recorded: its role (gpu, nvswitch, nic, upstream), ids, the devices it is
    above (an upstream port), the raw AER file texts (None: no such file) and read errors."""

    bus_id: str
    role: str
    vendor: str | None
    device: str | None
    pci_class: str | None
    below: list[str]
    aer: dict[str, str | None]
    errors: dict[str, str]


class PcieAerRecord(TypedDict):
    """The snapshot's `pcie_aer`: where it was read, why not (error), the devices; for an lspci
    capture the raw lspci text lines instead of devices."""

    source: str
    error: str | None
    devices: list[AerDeviceRecord]
    lspci: list[str] | None


def _hex(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="ascii").strip(), 16)
    except (OSError, ValueError):
        return None


def role_of(vendor: int | None, pci_class: int | None) -> str | None:
    """gpu / nvswitch / nic for the devices whose AER the checks judge, else None."""
    if pci_class is None:
        return None
    base = pci_class >> 8
    if vendor == NVIDIA_VENDOR and base in (0x0300, 0x0302):
        return "gpu"
    if vendor == NVIDIA_VENDOR and base == 0x0680:
        return "nvswitch"
    if base >> 8 == 0x02:
        return "nic"
    return None


def _upstream_ports(dev_dir: Path) -> list[str]:
    """The PCI bridges above a device: the PCI addresses on its path under /sys/devices."""
    try:
        real = os.path.realpath(dev_dir)
    except OSError:
        return []
    parts = [p for p in Path(real).parts[:-1] if _BDF_RE.match(p)]
    return parts


def _aer_texts(dev_dir: Path) -> tuple[dict[str, str | None], dict[str, str]]:
    texts: dict[str, str | None] = {}
    errors: dict[str, str] = {}
    for name in AER_FILES:
        try:
            texts[name] = (dev_dir / f"aer_dev_{name}").read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            texts[name] = None
        except OSError as e:
            texts[name] = None
            errors[name] = f"{type(e).__name__}: {e.strerror or e}"
    return texts, errors


def _record(base: Path, name: str, role: str, below: list[str]) -> AerDeviceRecord:
    dev = base / name
    vendor, device, cls = _hex(dev / "vendor"), _hex(dev / "device"), _hex(dev / "class")
    texts, errors = _aer_texts(dev)
    return {"bus_id": name, "role": role, "vendor": None if vendor is None else f"{vendor:#06x}",
            "device": None if device is None else f"{device:#06x}",
            "pci_class": None if cls is None else f"{cls:#08x}", "below": below, "aer": texts, "errors": errors}


def read_pcie_aer(sysfs_root: str | os.PathLike[str] = "/sys") -> PcieAerRecord:
    """The AER files of the GPUs, NVSwitches, NICs and their upstream ports under `sysfs_root`.
    Never raises: a bus that cannot be listed is `error`."""
    base = Path(sysfs_root) / "bus" / "pci" / "devices"
    try:
        names = sorted(os.listdir(base))
    except OSError as e:
        return {"source": "sysfs", "error": f"cannot list {base}: {e.strerror or e}", "devices": [], "lspci": None}
    devices: list[AerDeviceRecord] = []
    above: dict[str, list[str]] = {}
    for name in names:
        role = role_of(_hex(base / name / "vendor"), _hex(base / name / "class"))
        if role is None or normalize_bus_id(name) is None:
            continue
        devices.append(_record(base, name, role, []))
        for port in _upstream_ports(base / name):
            above.setdefault(port, []).append(name)
    own = {d["bus_id"] for d in devices}
    for port in sorted(above):
        if port not in own and (base / port).exists():
            devices.append(_record(base, port, "upstream", sorted(above[port])))
    return {"source": "sysfs", "error": None, "devices": devices, "lspci": None}


def parse_aer_counters(text: str | None) -> dict[str, int] | None:
    """`NAME COUNT` lines of an aer_dev_* file -> {NAME: COUNT}; None for no file. Raises
    ValueError for text that is not such lines (judged unreadable, never zero)."""
    if text is None:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise ValueError(f"not an AER counter line: {line.strip()[:80]!r}")
        out[parts[0]] = int(parts[1])
    if not out:
        raise ValueError("empty AER counter file")
    return out


def counter_total(counts: dict[str, int], kind: str) -> int:
    """The file's TOTAL_ERR_* line, else the sum of its counters."""
    total = counts.get(TOTAL_KEYS[kind])
    return total if total is not None else sum(v for k, v in counts.items() if not k.startswith("TOTAL_"))


# -- lspci -vvv -----------------------------------------------------------------------------------


class LspciDevice(TypedDict):
    """One lspci -vvv device block: its address, description, role, link capability and status,
    whether lspci says the link is downgraded, and the set (+) bits of UESta and CESta (None: the
    block has no AER capability or no link lines)."""

    bus_id: str
    description: str
    role: str | None
    link_cap: str | None
    link_status: str | None
    downgraded: bool
    uncorrectable_set: list[str] | None
    correctable_set: list[str] | None


_HEADER_RE = re.compile(r"^(?P<bus>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) (?P<desc>.+)$")
_FIELD_RE = re.compile(r"^\s+(?P<key>LnkCap|LnkSta|UESta|CESta):\s*(?P<value>.*)$")


def _lspci_role(desc: str) -> str | None:
    d = desc.lower()
    if "nvidia" in d and ("3d controller" in d or "vga compatible" in d):
        return "gpu"
    if d.startswith("bridge:") and "nvidia" in d:  # class 0x0680 "Bridge" (NVSwitch), never a "PCI bridge"
        return "nvswitch"
    if d.startswith(("ethernet controller", "infiniband controller", "network controller")):
        return "nic"
    return None


def _set_bits(value: str) -> list[str]:
    return [w[:-1] for w in value.split() if w.endswith("+")]


def parse_lspci_vvv(text: str) -> list[LspciDevice]:
    """Every device block of `lspci -vvv` output (a block starts with `bb:dd.f description`)."""
    out: list[LspciDevice] = []
    cur: LspciDevice | None = None
    for line in text.splitlines():
        head = _HEADER_RE.match(line)
        if head is not None:
            bus = normalize_bus_id(head.group("bus"))
            if bus is None:
                cur = None
                continue
            cur = {"bus_id": bus, "description": head.group("desc").strip(), "role": _lspci_role(head.group("desc")),
                   "link_cap": None, "link_status": None, "downgraded": False, "uncorrectable_set": None,
                   "correctable_set": None}
            out.append(cur)
            continue
        m = _FIELD_RE.match(line)
        if cur is None or m is None:
            continue
        key, value = m.group("key"), m.group("value").strip()
        if key == "LnkCap":
            cur["link_cap"] = value
        elif key == "LnkSta":
            cur["link_status"] = value
            cur["downgraded"] = "downgraded" in value
        elif key == "UESta":
            cur["uncorrectable_set"] = _set_bits(value)
        else:
            cur["correctable_set"] = _set_bits(value)
    return out
