"""The network events of this node's kernel log (live) or of a snapshot's recorded one, for the
net.flaps and gdr.peermem checks: read (sources), then parsed (netevents)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from .netevents import NetEvents, parse_net_events
from .scan import read_from_snapshot
from .sources.base import ReadResult
from .sources.selection import read_kernel_log


@dataclass
class NetScan:
    events: NetEvents = field(default_factory=NetEvents)
    error: str | None = None  # the kernel log could not be read
    source: str | None = None
    absent: bool = False  # a replayed snapshot that holds no kernel log


def events_of(read: ReadResult) -> NetScan:
    if not read.ok:
        return NetScan(error=read.error or "cannot read the kernel log")
    out = NetScan(source=read.describe())
    for chunk in read.chunks:
        found = parse_net_events(chunk.lines, boot_time=chunk.boot_time, ref_time=chunk.ref_time)
        out.events.links += found.links
        out.events.peermem += found.peermem
    return out


def scan_live(since: float | None, *, source: str = "auto", timeout_s: float = 8.0) -> NetScan:
    """This node's kernel log since `since` (epoch; None: the whole boot). Never raises."""
    try:
        return events_of(read_kernel_log(source, since=since, timeout_s=timeout_s))
    except (OSError, ValueError) as e:
        return NetScan(error=f"cannot read the kernel log: {e}")


def scan_recorded(kernel_log: Mapping[str, Any] | None, captured_at: float | None) -> NetScan:
    """A snapshot's recorded kernel log (None: the snapshot holds none)."""
    if not isinstance(kernel_log, Mapping):
        return NetScan(absent=True)
    return events_of(read_from_snapshot(dict(kernel_log), captured_at if captured_at is not None else time.time()))


def scan_for(snapshot: Mapping[str, Any], *, replayed: bool, since: float | None,
             captured_at: float | None) -> NetScan:
    """The network events a check judges: a replayed snapshot's recorded kernel log; live, this
    node's log since `since` when the snapshot shows RDMA ports (or could not read them); else
    nothing read (no RDMA hardware: nothing to look for)."""
    if replayed:
        return scan_recorded(snapshot.get("kernel_log"), captured_at)
    net = snapshot.get("net")
    if isinstance(net, Mapping) and (net.get("ports") or net.get("error")):
        return scan_live(since)
    return NetScan()
