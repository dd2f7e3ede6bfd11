"""PCIe AER lines of the kernel log -> typed events (pure; no I/O).

The kernel's AER driver reports an error in a block of lines, the port that received it first:

    pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010
    pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, ...
    pcieport 0000:00:02.0:   device [8086:6f04] error status/mask=00000020/00000000
    pcieport 0000:00:02.0:    [ 5] Surprise Down Error    (First)
    nvidia 0000:02:00.0: device has no AER-aware driver

One event per ``PCIe Bus Error: severity=`` line, on the device that prints it; the ``[ n] Name``
lines name its error bits. A device other than the port that prints an AER line inside the
port's block (the GPU below it: "can't recover", "no AER-aware driver", its own "PCIe Bus
Error"), and the block's source id (``received: 0000:..``, ``id=0010``), are what the event is
tied to: so a root port's fatal error is the GPU's when the block names the GPU.

A line whose time cannot be parsed (relative ``[  +0.000844]`` stamps, a localized month) gets
time None: unknown, never old.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .timeparse import parse_prefix

# The bytes a kernel-log line must hold to be kept for these parsers (the fast line filter of
# platform/kernlog/sources/linefilter.py): every AER line says "AER" (also "AER-aware"), the
# event line of older kernels says "PCIe Bus Error".
AER_NEEDLES: tuple[bytes, ...] = (b"AER", b"PCIe Bus Error")

SEVERITIES = ("corrected", "nonfatal", "fatal")

_DEVICE_RE = re.compile(r"(?:^|\s)(?P<driver>[\w.-]+) (?P<bus>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]):"
                        r"\s(?P<rest>.*)$")
_SEVERITY_RE = re.compile(r"PCIe Bus Error: severity=(?P<sev>[^,]+)(?:, type=(?P<type>[^,]+))?")
_RECEIVED_RE = re.compile(r"error (?:message )?received(?: from)?:?\s*(?:(?P<bdf>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:"
                          r"[0-9a-fA-F]{2}\.[0-7])|id=(?P<id>[0-9a-fA-F]{4}))", re.IGNORECASE)
_BIT_RE = re.compile(r"^(?:AER:)?\s*\[\s*(?P<bit>\d+)\]\s+(?P<name>.*?)\s*(?:\(First\))?\s*$")
_RECOVERY_FAILED = ("device recovery failed", "can't recover")


@dataclass(frozen=True)
class AerEvent:
    """One AER error report: the device that printed it, its severity (corrected / nonfatal /
    fatal), the layer, the error bits named, the devices its block ties it to, its time (None:
    unknown) and its line."""

    device: str
    driver: str
    severity: str
    layer: str | None
    errors: tuple[str, ...]
    tied_to: tuple[str, ...]
    time: float | None
    line: str


@dataclass
class AerLog:
    """What the AER lines of a log say: the events in order, the lines that say a recovery
    failed (device -> the line), and the driver each device's lines name (nvidia, mlx5_core,
    pcieport, ...)."""

    events: list[AerEvent] = field(default_factory=list)
    recovery_failed: dict[str, str] = field(default_factory=dict)
    drivers: dict[str, str] = field(default_factory=dict)


def normal_bus_id(text: str, domain: str = "0000") -> str:
    """A PCI address as 0000:bb:dd.f (lower case; the domain added where it is missing)."""
    t = text.strip().lower()
    return t if t.count(":") == 2 else f"{domain}:{t}"


def severity_of(text: str) -> str | None:
    """corrected / nonfatal / fatal for the kernel's severity words, None for others."""
    t = text.strip().lower()
    if t.startswith(("corrected", "correctable")):
        return "corrected"
    if "non-fatal" in t or "nonfatal" in t:
        return "nonfatal"
    if "fatal" in t:
        return "fatal"
    return None


def _source_of(m: re.Match[str], port: str) -> str | None:
    if m.group("bdf"):
        return normal_bus_id(m.group("bdf"), port[:4])
    if m.group("id"):  # requester id: bus << 8 | device << 3 | function
        rid = int(m.group("id"), 16)
        return f"{port[:4]}:{rid >> 8:02x}:{(rid >> 3) & 0x1f:02x}.{rid & 7}"
    return None


@dataclass
class _Block:
    port: str
    tied: set[str] = field(default_factory=set)


@dataclass
class _Pending:
    device: str
    driver: str
    severity: str
    layer: str | None
    time: float | None
    line: str
    block: _Block | None
    errors: list[str] = field(default_factory=list)


class AerParser:
    """Feed lines in order; `result()` gives the AerLog."""

    def __init__(self) -> None:
        self._pending: list[_Pending] = []
        self._block: _Block | None = None
        self._last_of: dict[str, _Pending] = {}
        self._log = AerLog()

    def feed(self, line: str, *, boot_time: float | None = None, ref_time: float | None = None) -> None:
        stamp = parse_prefix(line, boot_time=boot_time, ref_time=ref_time)
        m = _DEVICE_RE.search(stamp.message)
        if m is None:
            return
        dev, driver, rest = normal_bus_id(m.group("bus")), m.group("driver"), m.group("rest").strip()
        self._log.drivers.setdefault(dev, driver)
        received = _RECEIVED_RE.search(rest)
        if received is not None and "AER" in rest:
            self._block = _Block(dev)
            src = _source_of(received, dev)
            if src is not None and src != dev:
                self._block.tied.add(src)
            return
        if self._block is not None and dev != self._block.port and ("AER" in rest or "PCIe Bus Error" in rest):
            self._block.tied.add(dev)
        if any(w in rest for w in _RECOVERY_FAILED):
            self._log.recovery_failed.setdefault(dev, line.strip())
        sev = _SEVERITY_RE.search(rest)
        if sev is not None:
            severity = severity_of(sev.group("sev"))
            if severity is None:
                return
            block = self._block if self._block is not None and self._block.port == dev else None
            p = _Pending(dev, driver, severity, (sev.group("type") or "").strip() or None, stamp.epoch,
                         line.strip(), block)
            self._pending.append(p)
            self._last_of[dev] = p
            return
        bit = _BIT_RE.match(rest)
        if bit is not None and dev in self._last_of:
            self._last_of[dev].errors.append(bit.group("name").strip())

    def result(self) -> AerLog:
        self._log.events = [
            AerEvent(p.device, p.driver, p.severity, p.layer, tuple(p.errors),
                     tuple(sorted(p.block.tied - {p.device})) if p.block is not None else (), p.time, p.line)
            for p in self._pending]
        return self._log


def parse_aer_lines(lines: list[str], *, boot_time: float | None = None, ref_time: float | None = None) -> AerLog:
    """The AER events of `lines` (one log, in order)."""
    p = AerParser()
    for line in lines:
        p.feed(line, boot_time=boot_time, ref_time=ref_time)
    return p.result()
