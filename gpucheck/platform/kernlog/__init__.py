"""Kernel-log reading: Xid and SXid events of NVIDIA GPUs and NVSwitches.

    sources    read /dev/kmsg, journalctl -k, dmesg, log files, any file or stdin (plain lines)
    timeparse  line prefixes -> absolute times; --since -> a window start
    parse      lines -> Xid / SXid events (pure)
    catalog    NVIDIA's Xid catalog with gpucheck's severity and action (data)
    mapping    PCI bus id -> GPU index and UUID
    judge      events -> Results (pure)
    scan       the pipeline: window -> read -> parse -> filter
    follow     stream new events as they arrive

`capture_for_snapshot()` records the relevant kernel-log lines into a telemetry snapshot, so that a
replayed snapshot is judged on its own machine's log, not on the replaying machine's.
"""

from __future__ import annotations

import time
from typing import Any


def capture_for_snapshot(max_lines: int = 20000, *, source: str = "auto",
                         paths: Any = None, timeout_s: float = 8.0) -> dict[str, Any]:
    """The NVRM / NVSwitch / PCIe AER lines (and the network checks' lines: platform/kernlog/netevents.NET_NEEDLES)
    of this boot's kernel log, for `gpucheck telemetry dump`.

    Returns {"source", "lines", "error", "boot_time", "captured_at", "records", "notes"}: the
    newest `max_lines` relevant lines with their original prefixes (kmsg records keep theirs, so
    `boot_time` times them), or an `error` that says why nothing could be read. Never raises.
    """
    from .sources.base import DEFAULT_PATHS
    from .sources.selection import read_kernel_log

    try:
        res = read_kernel_log(source, paths=paths or DEFAULT_PATHS, timeout_s=timeout_s)
    except Exception as e:  # noqa: BLE001 - a snapshot records the failure instead of crashing
        return {"source": None, "lines": [], "error": f"{type(e).__name__}: {e}", "boot_time": None,
                "captured_at": time.time(), "records": None, "notes": []}
    lines = res.lines
    truncated = max(0, len(lines) - max_lines)
    notes = list(res.notes)
    if truncated:
        lines = lines[-max_lines:]
        notes.append(f"{truncated} older relevant line(s) left out (max_lines={max_lines})")
    return {
        "source": res.source,
        "lines": lines if res.ok else [],
        "error": res.error,
        "boot_time": res.boot_time,
        "captured_at": time.time(),
        "records": res.records,
        "notes": notes,
    }
