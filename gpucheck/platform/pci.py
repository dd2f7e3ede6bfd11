"""PCI bus id normalisation shared by NVML, sysfs and kernel-log readers."""

from __future__ import annotations

import re

# domain (4 or 8 hex digits, optional) : bus : device [. function]
_BUS_RE = re.compile(
    r"^(?:(?P<dom>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?$"
)


def normalize_bus_id(text: str, *, function: bool = True) -> str | None:
    """'00000000:3B:00.0' / '0000:3b:00' / '3b:00.0' -> '0000:3b:00.0' (or '0000:3b:00' with
    function=False). None when `text` is no PCI address. Domains wider than 16 bits keep their
    low 16 bits only when the high ones are zero (NVML pads the domain to 8 digits)."""
    m = _BUS_RE.match(text.strip())
    if not m:
        return None
    dom = int(m.group("dom") or "0", 16)
    if dom > 0xFFFF:
        return None
    bus, dev = int(m.group("bus"), 16), int(m.group("dev"), 16)
    if dev > 0x1F:
        return None
    base = f"{dom:04x}:{bus:02x}:{dev:02x}"
    if not function:
        return base
    return f"{base}.{int(m.group('fn') or 0)}"


def short_bus_id(text: str) -> str | None:
    """The `dddd:bb:dd` form (no function) used by Xid lines."""
    return normalize_bus_id(text, function=False)
