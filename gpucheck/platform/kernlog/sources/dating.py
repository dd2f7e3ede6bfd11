"""Dating a copied log: whether its `[seconds]` stamps count from this machine's boot.

A log copied from another machine, or from an earlier boot, counts its seconds from a boot whose
time is unknown here: dating it by this boot would invent its times. Its lines are dated only
when one of them is in this boot's kernel log with the same stamp and text."""

from __future__ import annotations

import re

from .base import LogPaths, ReadResult
from .kmsg import read_kmsg

_MONO_LINE_RE = re.compile(r"^\[\s*(\d+)\.(\d{1,9})\]\s?(.*)$")
_KMSG_LINE_RE = re.compile(r"^\d{1,3},\d+,(\d+),[^;]*;(.*)$")


def boot_clock_stamps(lines: list[str], limit: int = 500) -> set[tuple[int, str]]:
    """(microseconds since boot, message) of lines timed by a boot clock: ``[ 5107.644336] ...``
    (dmesg) and kmsg records. At most `limit` of them."""
    out: set[tuple[int, str]] = set()
    for ln in lines:
        m = _MONO_LINE_RE.match(ln)
        if m:
            out.add((int(m.group(1)) * 1_000_000 + int(m.group(2).ljust(6, "0")[:6]), m.group(3).strip()))
        else:
            k = _KMSG_LINE_RE.match(ln)
            if k:
                out.add((int(k.group(1)), k.group(2).strip()))
        if len(out) >= limit:
            break
    return out


def not_this_boot(lines: list[str], paths: LogPaths, boot_time: float | None) -> str | None:
    """Why the [seconds] stamps of a copied log cannot be dated against this machine's boot (None
    when they can: there are none, or one of its lines is in this boot's kernel log, same stamp
    and text)."""
    stamps = boot_clock_stamps(lines)
    if not stamps:
        return None
    if boot_time is None:
        return "this machine's boot time is unknown"
    try:
        live = read_kmsg(paths.kmsg)
    except OSError as e:
        return f"this boot's kernel log ({paths.kmsg}) could not be read to compare it ({e.strerror or e})"
    if stamps & boot_clock_stamps(live.lines, limit=1 << 30):
        return None
    return "none of its [seconds]-stamped lines is in this boot's kernel log"


def boot_for(res: ReadResult, origin: str, lines: list[str], paths: LogPaths, boot_time: float | None) -> float | None:
    """The boot time a file's [seconds] stamps count from: this boot's, or None (times unknown,
    noted on `res`)."""
    why = not_this_boot(lines, paths, boot_time)
    if why is None:
        return boot_time
    res.undated.append(origin)
    res.notes.append(f"times unknown for {origin}: its [seconds] stamps are not dated ({why})")
    return None
