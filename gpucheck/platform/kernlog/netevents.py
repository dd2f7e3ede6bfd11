"""Network events of the kernel log (and the syslog/journal around it): link down/up of mlx5 and
other netdevs, carrier lost/gained (systemd-networkd, IPoIB), and the GPUDirect RDMA module's
(nvidia_peermem, nv_peer_mem) load and run-time errors. Pure parsers over lines: each event with
its parsed time, or None where the line's time cannot be placed (unknown, never old).

`NET_NEEDLES` is what the kernel-log line filter keeps for these parsers
(platform/kernlog/sources/linefilter.py), so that a recorded snapshot's `kernel_log` holds them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from .timeparse import parse_prefix

# Bytes a relevant line holds (the line filter's first test): "Link up"/"Link is Down", carrier
# changes, and the two names of the GPUDirect RDMA module (nvidia_peermem, nvidia-peermem, nv_peer_mem).
NET_NEEDLES: tuple[bytes, ...] = (b"Link ", b"carrier", b"peermem", b"peer_mem")

# "mlx5_core 0000:01:00.1 eth1: Link up", "igb 0000:03:00.0 eno1: igb: eno1 NIC Link is Down",
# "ixgbe 0000:18:00.0 ens1f0: NIC Link is Up 10 Gbps". Capital L: "ata6: SATA link down" is a disk.
_LINK = re.compile(r"(?P<iface>[A-Za-z0-9_.@-]+): (?:[a-z0-9_]+: (?P=iface) )?(?:NIC )?Link (?:is )?(?P<dir>[Uu]p|[Dd]own)\b")
# "ib6: lost carrier" / "ib6: Gained carrier" (systemd-networkd), "eth0: carrier lost" / "carrier on".
_CARRIER = re.compile(r"(?P<iface>[A-Za-z0-9_.@-]+): (?:(?P<lost>[Ll]ost carrier|carrier lost|carrier off)|"
                      r"(?P<gained>[Gg]ained carrier|carrier gained|carrier on))\b")
_PEERMEM = re.compile(r"\b(?P<module>nvidia[_-]peermem|nv_peer_mem)\b")
_LOAD_ERROR = re.compile(r"Unknown symbol|disagrees about version of symbol|could not insert|"
                         r"failed to load|Invalid module format|Exec format error")
# dmesg --decode: "kern  :info  : " before the time.
_FACILITY = re.compile(r"^[a-z]+\s*:[a-z]+\s*: ")


@dataclass(frozen=True)
class LinkEvent:
    """A link or carrier change of one interface."""

    iface: str
    up: bool
    kind: str  # "link" | "carrier"
    time: float | None  # None: the line's time could not be placed
    line: str


@dataclass(frozen=True)
class PeermemEvent:
    """A line of the GPUDirect RDMA module: a load error (unknown symbol, version mismatch, modprobe
    refused it) or another error while loaded (e.g. "invalid context")."""

    module: str  # nvidia_peermem | nv_peer_mem
    load_error: bool
    time: float | None
    line: str


@dataclass
class NetEvents:
    links: list[LinkEvent] = field(default_factory=list)
    peermem: list[PeermemEvent] = field(default_factory=list)


def _link_event(msg: str, t: float | None, line: str) -> LinkEvent | None:
    m = _LINK.search(msg)
    if m:
        return LinkEvent(m.group("iface"), m.group("dir").lower() == "up", "link", t, line)
    m = _CARRIER.search(msg)
    if m:
        return LinkEvent(m.group("iface"), m.group("gained") is not None, "carrier", t, line)
    return None


def parse_net_line(line: str, *, boot_time: float | None = None,
                   ref_time: float | None = None) -> LinkEvent | PeermemEvent | None:
    """One line -> its event, or None."""
    line = line.rstrip("\r\n")
    stamp = parse_prefix(_FACILITY.sub("", line, count=1), boot_time=boot_time, ref_time=ref_time)
    msg = stamp.message
    pm = _PEERMEM.search(msg)
    if pm:
        return PeermemEvent(pm.group("module").replace("-", "_"), bool(_LOAD_ERROR.search(msg)), stamp.epoch, line)
    return _link_event(msg, stamp.epoch, line)


def parse_net_events(lines: Iterable[str], *, boot_time: float | None = None,
                     ref_time: float | None = None) -> NetEvents:
    """Every network event of `lines` (oldest first)."""
    out = NetEvents()
    for line in lines:
        ev = parse_net_line(line, boot_time=boot_time, ref_time=ref_time)
        if isinstance(ev, LinkEvent):
            out.links.append(ev)
        elif isinstance(ev, PeermemEvent):
            out.peermem.append(ev)
    return out
