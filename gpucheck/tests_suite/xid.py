"""xid: Xid and SXid errors in the kernel log (level 1, the Slurm prolog's main detector).

Reads the kernel log (auto: /dev/kmsg, then journalctl -k, dmesg, /var/log files), keeps the
events of the window (default `last-pass`: everything since the last passing run, so a prolog
fails for new errors and not for ones already handled; a GPU's events since the last passing run
that examined that GPU, gpucheck.platform.kernlog.cursor; `ctx.options.xid_since`, set by the Slurm
epilog to the job's start, wins), maps them to GPUs and judges them with the catalog in
gpucheck.xid.catalog. See docs/xid.md.

When `gpucheck run` replays a recorded snapshot, the live kernel log belongs to another machine:
the snapshot's own `kernel_log` is judged instead, or the check is skipped saying so.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..platform.kernlog.cursor import gpu_starts
from ..platform.kernlog.mapping import GpuInfo, GpuMap, from_announcements, from_snapshot
from ..platform.kernlog.scan import Window, keep_from, read_from_snapshot, resolve_window, scan, scan_read
from ..platform.kernlog.sources.selection import SOURCES
from ..platform.kernlog.timeparse import parse_timestamp, validate_since
from ..platform.pci import short_bus_id
from ..sdk import Context, Level, Limit, Need, Result, Status, define
from ..xid import judge as J

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import Snapshot

ID = "xid"
DEFAULTS: J.XidParams = {**J.DEFAULT_PARAMS}
LIMITS = {
    "since": Limit("str", parse=validate_since, words="a window: a duration (2h), a timestamp, boot, all or last-pass"),
    "source": Limit("str", choices=SOURCES),
    "files": Limit("list", item="str"),
    "ignore_xids": Limit("list", item="int", low=1),  # Xid numbers start at 1
    "max_evidence_lines": Limit("int", 1),
}


def _inventory(ctx: Context) -> list[GpuInfo]:
    out = []
    for g in ctx.selected_gpu_entries():
        bus = short_bus_id(str(g.get("pci_bus_id") or ""))
        if bus is not None and isinstance(g.get("index"), int):
            out.append(GpuInfo(bus, g["index"], g.get("uuid"), g.get("serial"), g.get("name")))
    return out


def _snapshot_epoch(snap: "Snapshot | dict[str, None]") -> float | None:
    v = snap.get("captured_at")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return parse_timestamp(v) if isinstance(v, str) else None


def _since(ctx: Context, params: J.XidParams) -> tuple[str, str | None]:
    """The window of this run and a note: the job start the Slurm epilog passes
    (`ctx.options.xid_since`, from its record in the state directory) wins over the configured
    `since`; one that is no time (a NaN record) is ignored, and the whole boot judged."""
    given = ctx.options.xid_since
    if given in (None, ""):
        return str(params.get("since", "last-pass")), None
    try:
        validate_since(str(given))
    except ValueError:
        return "boot", f"warning: ignored the job start {given!r}: it is no time"
    return str(given), None


def run(ctx: Context) -> list[Result]:
    params = ctx.params(ID, DEFAULTS)
    since, since_note = _since(ctx, params)
    snapshot: Snapshot | dict[str, None] = ctx.snapshot or {}

    try:
        if ctx.options.snapshot_path:
            kl = snapshot.get("kernel_log")
            if not isinstance(kl, dict):
                return [Result(ID, Status.SKIP, "snapshot has no kernel log")]
            captured = _snapshot_epoch(snapshot)
            kl_boot = kl.get("boot_time") if isinstance(kl.get("boot_time"), (int, float)) else None
            read = read_from_snapshot(kl, captured)
            note = None
            if since == "last-pass":
                # The cursor on this machine says nothing about the recorded one.
                since = "boot"
                note = "replayed snapshot: no last-pass cursor for the recorded machine, judging its whole boot"
            window = resolve_window(since, now=captured or time.time(), boot_time=kl_boot)
            if note:
                window.note = note
            sc = scan_read(read, window)
        else:
            files = [str(f) for f in params.get("files") or []]
            sc = scan(source=str(params.get("source", "auto")), files=files or None, since=since,
                      state=ctx.state, timeout_s=float(params.get("read_timeout_s", 8.0)))
    except ValueError as e:
        return [Result(ID, Status.ERROR, f"bad xid setting: {e}",
                       evidence=[f"since={since!r}", f"source={params.get('source')!r}"])]

    if not sc.ok:
        return [J.error_result(ID, sc.read.error or "cannot read the kernel log", sc.read.attempts)]

    gpu_map = from_snapshot(ctx.snapshot).merged_with(from_announcements(sc.parsed.announcements))
    mark_notes = _from_gpu_marks(sc, gpu_map)
    return J.judge(
        check=ID,
        events=sc.events,
        sxid_events=sc.sxid_events,
        unrecognised=sc.unrecognised,
        gpu_map=gpu_map,
        params=params,
        read_summary=sc.read.describe(),
        window_label=sc.window.label,
        notes=([since_note] if since_note else []) + _notes(sc.window, sc) + mark_notes,
        selection=ctx.gpus,
        inventory=_inventory(ctx),
    )


def _from_gpu_marks(sc: Any, gpu_map: GpuMap) -> list[str]:
    """With the last-pass window, judge each GPU's events from its own last-pass mark where a run
    on that GPU passed after the node mark (gpucheck.platform.kernlog.cursor): a GPU is matched by UUID;
    every event that names no GPU with a UUID keeps the window's start (the node mark). Returns
    the notes for the node result."""
    if sc.window.since != "last-pass" or sc.window.cursor is None:
        return []
    starts = gpu_starts(sc.window.cursor, sc.window.start, time.time())
    if starts.by_uuid:
        def start_of(ev: Any) -> float | None:
            info = gpu_map.lookup(ev.pci_bus_id)
            return starts.start_for(info.uuid if info is not None else None, sc.window.start)

        keep_from(sc, start_of)
    return starts.notes


def _notes(window: Window, sc: Any) -> list[str]:
    notes = [window.note] if window.note else []
    notes.extend(sc.read.notes)
    notes.extend(f"tried {a} first" for a in sc.read.attempts if not a.ok)
    if sc.before_window:
        notes.append(f"{sc.before_window} older event(s) in the log are before the window and not judged")
    if sc.untimed:
        notes.append(f"{sc.untimed} event(s) have no time and were judged as inside the window")
    return notes


CHECK = define(
    ID,
    title="Xid / SXid errors in the kernel log",
    level=Level.QUICK,
    needs=(Need.KERNEL_LOG,),
    budget_s=15.0,
    detects="GPU fell off the bus, double-bit ECC, GSP timeouts, NVLink and NVSwitch faults (Xid/SXid)",
    defaults=DEFAULTS,
    limits=LIMITS,
)(run)

CHECKS = [CHECK]
