"""The pipeline shared by the `xid` check, `gpucheck xid` and the benchmark:
window (--since) -> read -> parse -> keep what is in the window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .cursor import LAST_PASS_CURSOR, gpu_marks, has_node_mark, mark_epoch
from .parse import ParseResult, Parser, SXidEvent, Unrecognised, XidEvent
from .sources.base import Attempt, Chunk, DEFAULT_PATHS, LogPaths, ReadResult, read_boot_time
from .sources.selection import read_kernel_log
from .timeparse import in_window, iso_utc, parse_duration, parse_timestamp, usable_start, validate_since


@dataclass
class Window:
    since: str  # what was asked: boot, all, last-pass, 2h, a timestamp
    start: float | None  # epoch; None = everything the source holds
    label: str  # for people: "since boot (2024-05-18T07:00:00Z)"
    note: str | None = None  # e.g. "no last-pass cursor: judging everything since boot"
    cursor: Any = field(default=None, repr=False, compare=False)  # the last-pass cursor read, if any

    def to_dict(self) -> dict[str, Any]:
        return {"since": self.since, "start": iso_utc(self.start), "start_epoch": self.start,
                "label": self.label, "note": self.note}


def _whole_boot(since: str, now: float, boot_time: float | None, note: str) -> Window:
    w = resolve_window("boot", now=now, boot_time=boot_time)
    w.since = since
    w.note = f"{note}: judging everything {w.label}"
    return w


def resolve_window(since: str, *, now: float, boot_time: float | None, state: Any = None) -> Window:
    """Turn a --since value into a window start. Raises ValueError for a bad value. A start that
    cannot be trusted (see `usable_start`: a last-pass cursor or a timestamp ahead of now, an
    unreadable or absurd cursor) is ignored with a note, and the whole boot is judged."""
    s = validate_since(since)
    if s == "all":
        return Window("all", None, "in everything read")
    if s == "last-pass":
        return _last_pass_window(now, boot_time, state)
    if s == "boot":
        if boot_time is None:
            return Window("boot", None, "since boot", "boot time unknown: judging everything read")
        return Window("boot", boot_time, f"since boot ({iso_utc(boot_time)})")
    d = parse_duration(s)
    if d is not None:
        if not now - d > 0:  # longer ago than the epoch: everything
            return Window(s, None, f"in the last {s} (everything read)")
        return Window(s, now - d, f"in the last {s} (since {iso_utc(now - d)})")
    t = parse_timestamp(s)
    why = usable_start(t, now)
    if why is not None:
        return _whole_boot(s, now, boot_time, f"ignored --since {s}: {why}")
    return Window(s, t, f"since {iso_utc(t)}")


def _last_pass_window(now: float, boot_time: float | None, state: Any) -> Window:
    """The window from the cursor's node mark (gpucheck.platform.kernlog.cursor); the cursor read rides
    along (`Window.cursor`) for the GPU marks, so that it is read once."""
    if state is None:
        return _whole_boot("last-pass", now, boot_time, "no state directory: no last-pass cursor")
    try:
        cur = state.read_cursor(LAST_PASS_CURSOR)
    except (OSError, ValueError) as e:
        return _whole_boot("last-pass", now, boot_time, f"cannot read the last-pass cursor ({e})")
    where = getattr(state, "root", "the state directory")
    if cur is None:
        return _whole_boot("last-pass", now, boot_time, f"no last-pass cursor in {where}")
    if not has_node_mark(cur) and gpu_marks(cur):
        w = _whole_boot("last-pass", now, boot_time, f"no run on every GPU has passed yet (last-pass cursor in "
                                                     f"{where}): for GPUs without a mark of their own")
    else:
        ep = mark_epoch(cur)
        why = usable_start(ep, now)
        if why is not None:
            w = _whole_boot("last-pass", now, boot_time, f"warning: ignored the last-pass cursor: {why}")
        else:
            w = Window("last-pass", ep, f"since the last passing run ({iso_utc(ep)})")
    w.cursor = cur
    return w


@dataclass
class Scan:
    read: ReadResult
    window: Window
    parsed: ParseResult = field(default_factory=ParseResult)
    events: list[XidEvent] = field(default_factory=list)
    sxid_events: list[SXidEvent] = field(default_factory=list)
    unrecognised: list[Unrecognised] = field(default_factory=list)
    before_window: int = 0  # events read but older than the window
    untimed: int = 0  # events without a time (kept: they cannot be placed outside the window)

    @property
    def ok(self) -> bool:
        return self.read.ok


def parse_read(read: ReadResult) -> ParseResult:
    p = Parser()
    for chunk in read.chunks:
        for line in chunk.lines:
            p.feed(line, boot_time=chunk.boot_time, ref_time=chunk.ref_time)
    return p.result


def scan_read(read: ReadResult, window: Window) -> Scan:
    """Parse what was read and keep what falls in the window."""
    sc = Scan(read=read, window=window)
    if not read.ok:
        return sc
    if read.undated:  # copied logs whose [seconds] stamps count from another boot: never dated
        window.label += f" (times unknown for {', '.join(read.undated)})"
    sc.parsed = parse_read(read)
    start = window.start
    for found, kept in ((sc.parsed.events, sc.events), (sc.parsed.sxid_events, sc.sxid_events)):
        for ev in found:
            if in_window(ev.time, ev.time_resolution, start):
                kept.append(ev)
                if ev.time is None:
                    sc.untimed += 1
            else:
                sc.before_window += 1
    sc.unrecognised = [u for u in sc.parsed.unrecognised if in_window(u.time, u.time_resolution, start)]
    return sc


def keep_from(sc: Scan, start_of: Callable[[XidEvent], float | None]) -> int:
    """Drop the Xid events older than their own start (`start_of(event)`: a GPU's last-pass mark,
    later than the window's start), compared at the line's resolution (timeparse.in_window);
    they count as before the window. Untimed events stay (they cannot be placed before
    anything). Returns how many were dropped."""
    kept: list[XidEvent] = []
    for ev in sc.events:
        start = start_of(ev)
        if not in_window(ev.time, ev.time_resolution, start):
            sc.before_window += 1
        else:
            kept.append(ev)
    dropped = len(sc.events) - len(kept)
    sc.events = kept
    return dropped


def scan(
    *,
    source: str = "auto",
    files: list[str] | None = None,
    boot: int = 0,
    since: str = "boot",
    now: float | None = None,
    state: Any = None,
    paths: LogPaths = DEFAULT_PATHS,
    timeout_s: float = 8.0,
    stdin: Any = None,
    boot_time: float | None = None,
) -> Scan:
    """Read the kernel log and return the events in the window. Raises ValueError for a bad
    `since` or `source` (usage errors); an unreadable log is `Scan.ok == False`, never an
    exception."""
    now = time.time() if now is None else now
    if boot_time is None:
        boot_time = read_boot_time(paths.proc_stat)
    window = resolve_window(since, now=now, boot_time=boot_time, state=state)
    read = read_kernel_log(source, files=files, boot=boot, since=window.start, paths=paths,
                           timeout_s=timeout_s, stdin=stdin, boot_time=boot_time)
    return scan_read(read, window)


def read_from_snapshot(kernel_log: dict[str, Any], captured_at: float | None) -> ReadResult:
    """A ReadResult from a snapshot's recorded kernel log ({"source", "lines", "error", "boot_time"})."""
    src = str(kernel_log.get("source") or "snapshot")
    res = ReadResult(boot_time=kernel_log.get("boot_time"))
    err = kernel_log.get("error")
    lines = kernel_log.get("lines")
    if err or not isinstance(lines, list):
        res.attempts.append(Attempt(f"snapshot:{src}", "recorded kernel log", False,
                                    str(err or "the recorded kernel log has no lines")))
        return res
    res.attempts.append(Attempt(f"snapshot:{src}", "recorded kernel log", True))
    res.source = f"snapshot:{src}"
    res.chunks.append(Chunk(f"snapshot:{src}", [str(x) for x in lines],
                            boot_time=kernel_log.get("boot_time"), ref_time=captured_at))
    res.records = kernel_log.get("records") if isinstance(kernel_log.get("records"), int) else None
    res.bytes_read = sum(len(x) + 1 for x in res.chunks[0].lines)
    for n in kernel_log.get("notes") or []:
        res.notes.append(str(n))
    return res
