"""`gpucheck xid`: Xid and SXid events in the kernel log, judged like the `xid` check.

    gpucheck xid                      this boot's live kernel log, as a table; exit code as a check
    gpucheck xid --json               the same as one JSON object (events, sxid_events, results)
    gpucheck xid --file kern.log.gz   any log file (or - for stdin), every event in it
    gpucheck xid --boot -1            the previous boot, from the journal
    gpucheck xid --since last-pass    only what is new since the last passing `gpucheck run`
    gpucheck xid --follow [--json]    stream new events until Ctrl-C
    gpucheck xid --ack                an operator handled the errors: move the last-pass cursor to now
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import click

from ..platform.messages import command, say_error
from .numbers import MAX_BOOTS, Count

SCHEMA_ID = "gpucheck.xid"
SCHEMA_VERSION = "1.0"


def _since_param(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from ..platform.kernlog.timeparse import validate_since

    try:
        return validate_since(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command("xid")
@click.option("--source", type=click.Choice(["auto", "kmsg", "journal", "dmesg", "files"]), default="auto",
              show_default=True, help="Where to read the kernel log (auto tries them in this order).")
@click.option("--file", "files", multiple=True, metavar="FILE",
              help="Read FILE instead (.gz is fine; - reads stdin). May be repeated, oldest first.")
@click.option("--boot", type=click.IntRange(-MAX_BOOTS, 0), default=0, show_default=True,
              help="Journal boot: 0 this boot, -1 the previous one (Xid 79 history often survives there).")
@click.option("--since", callback=_since_param, metavar="WHEN",
              help="Window: a duration (2h), a timestamp, boot, all or last-pass. "
                   "Default: boot for the live log, all for --file and --boot -1.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (JSON lines with --follow).")
@click.option("--follow", is_flag=True, help="Stream new events as they arrive, until Ctrl-C.")
@click.option("--ack", is_flag=True,
              help="Record that the errors so far were handled: write the last-pass cursor (now).")
@click.option("--state-dir", metavar="DIR", help="State directory (last-pass cursor). Default: gpucheck's.")
@click.option("--strict", is_flag=True, help="Treat warn as unhealthy (exit 1).")
@click.option("--on-error", type=click.Choice(["pass", "fail"]), default="pass", show_default=True,
              help="Exit code when the log cannot be read: pass -> 3, fail -> 1.")
@click.option("--no-nvml", is_flag=True, help="Do not ask NVML for GPU indices (or, with --follow, events).")
@click.option("--repeat-limit", type=Count(0, 1_000_000), default=None,
              help="Warn when one application-class Xid repeats more than this on one GPU (default 2).")
def xid_command(source: str, files: tuple[str, ...], boot: int, since: str | None, as_json: bool,
                follow: bool, ack: bool, state_dir: str | None, strict: bool, on_error: str,
                no_nvml: bool, repeat_limit: int | None) -> int:
    """Read the kernel log, classify every GPU Xid and NVSwitch SXid, and judge them.

    Exit codes as for a check: 0 healthy, 1 unhealthy, 2 usage error, 3 the log could not be read.
    """
    import socket

    from ..core.state import State, default_state_dir

    state = State(state_dir or default_state_dir(), host=socket.gethostname())  # this node's cursor (as a run's)
    if ack:
        if follow or files:
            raise click.UsageError("--ack cannot be combined with --follow or --file")
        return _ack(state)
    if follow:
        if boot != 0:
            raise click.UsageError("--follow reads new messages; --boot -1 is the past")
        return _follow(source, files, as_json, no_nvml)
    if boot != 0 and source not in ("auto", "journal"):
        raise click.UsageError("--boot needs the journal (--source journal or auto)")
    if boot != 0 and files:
        raise click.UsageError("--boot reads the journal; it cannot be combined with --file")
    _check_files(files)
    if since is None:
        since = "all" if (files or boot != 0) else "boot"
    return _report(source=source, files=list(files), boot=boot, since=since, as_json=as_json,
                   state=state, strict=strict, on_error=on_error, use_nvml=not no_nvml,
                   repeat_limit=repeat_limit)


def _check_files(files: tuple[str, ...]) -> None:
    """--file takes regular files (or - for stdin): a FIFO or a device such as /dev/zero would
    never end; an empty file has nothing to examine. A usage error (exit 2) up front; a missing
    file is reported as unread (exit 3), and so is an empty standard input (the reader: no bytes
    is no kernel log, never a pass)."""
    import os
    import stat

    for f in files:
        if f == "-":
            continue
        try:
            st = os.stat(f)
        except OSError:
            continue  # the reader reports it, with the reason
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise click.BadParameter(f"{f}: {kind}: --file reads regular files (a FIFO: --file - < {f})",
                                     param_hint="--file")
        if st.st_size == 0:  # an empty input the user names is a usage error, as `report` has it
            raise click.BadParameter(f"{f}: empty: nothing to examine", param_hint="--file")


# -- --ack ----------------------------------------------------------------------------------------

def _ack(state: Any) -> int:
    from ..platform.kernlog.cursor import LAST_PASS_CURSOR
    from ..platform.kernlog.timeparse import iso_utc

    now = time.time()
    try:
        ack = {"time": iso_utc(now), "epoch": now, "by": "gpucheck xid --ack"}
        state.update_cursor(LAST_PASS_CURSOR, lambda _cursor: ack)  # under the lock: no run's update undoes it
    except OSError as e:
        from ..platform.safeio import describe_error

        say_error(f"cannot write the last-pass cursor in {state.root}: {describe_error(e, str(state.root))}")
        return 2
    click.echo(f"last-pass cursor set to {iso_utc(now)} in {state.root}: "
               "the xid check now judges only errors logged after this moment")
    return 0


# -- the report -----------------------------------------------------------------------------------

def _report(*, source: str, files: list[str], boot: int, since: str, as_json: bool, state: Any,
            strict: bool, on_error: str, use_nvml: bool, repeat_limit: int | None) -> int:
    from ..xid import judge as J
    from ..platform.kernlog.mapping import GpuMap, from_announcements, from_nvml
    from ..platform.kernlog.scan import scan
    from ..core.verdict import exit_code_for

    params = J.DEFAULT_PARAMS.copy()
    if repeat_limit is not None:
        params["repeat_limit"] = repeat_limit
    try:
        sc = scan(source=source, files=files or None, boot=boot, since=since, state=state,
                  timeout_s=float(params["read_timeout_s"]))
    except ValueError as e:
        raise click.UsageError(str(e)) from None

    nvml_note = None
    gpu_map = GpuMap()
    live = not files and boot == 0
    if use_nvml and live and sc.ok:
        gpu_map, nvml_note = _nvml_map(from_nvml)
    gpu_map = gpu_map.merged_with(from_announcements(sc.parsed.announcements))

    if not sc.ok:
        results = [J.error_result("xid", sc.read.error or "cannot read the kernel log", sc.read.attempts)]
        classes: dict[int, J.Classification] = {}
    else:
        classes = J.classify_all(sc.events, gpu_map, params.get("ignore_xids", []))
        notes = [sc.window.note] if sc.window.note else []
        notes += sc.read.notes
        notes += [f"tried {a} first" for a in sc.read.attempts if not a.ok]
        if sc.before_window:
            notes.append(f"{sc.before_window} older event(s) are before the window and not judged")
        if sc.untimed:
            notes.append(f"{sc.untimed} event(s) have no time and were judged as inside the window")
        if nvml_note and live:
            notes.append(f"GPU indices: {nvml_note}; events are shown by PCI address")
        # Every GPU NVML knows gets a row, with or without events.
        inventory = [g for g in gpu_map.gpus() if g.index is not None]
        results = J.judge(check="xid", events=sc.events, sxid_events=sc.sxid_events,
                          unrecognised=sc.unrecognised, gpu_map=gpu_map, params=params,
                          read_summary=sc.read.describe(), window_label=sc.window.label, notes=notes,
                          inventory=inventory, classes=classes)
    code = exit_code_for(results, strict=strict, on_error=on_error)
    doc = _document(sc, results, classes, gpu_map, code, compact=not as_json)
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=False))
    else:
        _print_table(doc)
    return code


NVML_TIMEOUT_S = 5.0


def _nvml_map(reader: Any) -> tuple[Any, str | None]:
    """NVML's GPU list, read in a helper thread: a node with GSP timeouts may have a driver that
    does not answer, and the kernel log must still be reported (the thread is left behind)."""
    from ..platform.kernlog.mapping import GpuMap

    box: dict[str, Any] = {}
    th = threading.Thread(target=lambda: box.setdefault("r", reader()), name="xid-nvml-map", daemon=True)
    th.start()
    th.join(NVML_TIMEOUT_S)
    if "r" not in box:
        from ..platform.telemetry.nvml import live_library

        live_library().abandon(th)  # not shut down at exit while it is stuck: that call would hang too
        return GpuMap(), f"NVML did not answer within {NVML_TIMEOUT_S:g} s (stuck driver?)"
    return box["r"]


def _event_dict(ev: Any, cls: Any, gpu_map: Any) -> dict[str, Any]:
    d = ev.to_dict()
    g = gpu_map.lookup(ev.pci_bus_id)
    d["gpu"] = g.index if g is not None else None
    d["uuid"] = g.uuid if g is not None else None
    if cls is not None:
        d.update({"name": cls.name, "description": cls.description, "severity": cls.severity,
                  "action": cls.action, "bucket": cls.bucket, "note": cls.note, "known": cls.known})
    return d


def _document(sc: Any, results: list[Any], classes: dict[int, Any], gpu_map: Any, code: int,
              compact: bool = False) -> dict[str, Any]:
    """The --json object. compact (for the table): only the last event of each (address, Xid),
    with its `count`."""
    from ..xid.judge import classify_sxid
    from ..platform.kernlog.timeparse import iso_utc
    from ..core.result import strongest_action, worst_status

    sxids = []
    for sx in sc.sxid_events:
        d = sx.to_dict()
        d["severity"], d["action"] = classify_sxid(sx)
        sxids.append(d)
    return {
        "schema": SCHEMA_ID,
        "schema_version": SCHEMA_VERSION,
        "host": socket.gethostname(),
        "time": iso_utc(time.time()),
        "source": sc.read.source,
        "read": {
            "ok": sc.read.ok,
            "error": sc.read.error,
            "bytes": sc.read.bytes_read,
            "records": sc.read.records,
            "attempts": [{"source": a.source, "detail": a.detail, "ok": a.ok, "error": a.error}
                         for a in sc.read.attempts],
            "notes": list(sc.read.notes),
        },
        "window": sc.window.to_dict(),
        "gpu_map_source": gpu_map.source,
        "status": worst_status(r.status for r in results).value,
        "action": strongest_action(r.action for r in results).value,
        "exit_code": code,
        "events": _events(sc.events, classes, gpu_map, compact),
        "sxid_events": sxids,
        "unrecognised": [u.to_dict() for u in sc.unrecognised],
        "counts": {"events": len(sc.events), "sxid_events": len(sc.sxid_events),
                   "unrecognised": len(sc.unrecognised), "before_window": sc.before_window,
                   "untimed": sc.untimed},
        "results": [r.to_dict() for r in results],
    }


def _events(events: list[Any], classes: dict[int, Any], gpu_map: Any, compact: bool) -> list[dict[str, Any]]:
    if not compact:
        return [_event_dict(ev, classes.get(id(ev)), gpu_map) for ev in events]
    last: dict[tuple[Any, Any], Any] = {}
    count: dict[tuple[Any, Any], int] = defaultdict(int)
    for ev in events:
        key = (ev.pci_bus_id or ev.gpu_token, ev.kind)
        last[key] = ev
        count[key] += 1
    out = []
    for key, ev in last.items():
        d = _event_dict(ev, classes.get(id(ev)), gpu_map)
        d["count"] = count[key]
        out.append(d)
    return out


def _short_time(iso: str | None) -> str:
    if not iso:
        return "-"
    return iso[:19].replace("T", " ") + "Z"


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip()] + [fmt.format(*r).rstrip() for r in rows]


def _print_table(doc: dict[str, Any]) -> None:
    out = click.echo
    read, window = doc["read"], doc["window"]
    if read["ok"]:
        rec = f", {read['records']} records" if read["records"] is not None else ""
        out(f"Kernel log: {doc['source']} ({read['bytes']} bytes{rec}); window: {window['label']}")
    else:
        out(f"Kernel log: NOT READ: {read['error']}")
    if window.get("note"):
        out(f"  note: {window['note']}")
    for n in read["notes"]:
        out(f"  note: {n}")

    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for e in doc["events"]:
        groups[(e["pci_bus_id"] or e.get("gpu_token"), e["xid"] if e["xid"] is not None else e["signature"])].append(e)
    if groups:
        rows = []
        for (bus, xid), evs in sorted(groups.items(), key=lambda kv: (kv[1][-1]["epoch"] or 0, kv[0][0] or "")):
            last = evs[-1]
            gpu = "-" if last["gpu"] is None else str(last["gpu"])
            name = last.get("description") or last.get("name") or ""
            if last.get("nvlink") and last["nvlink"].get("unit"):
                name = f"{name} [{last['nvlink']['unit']}]"
            rows.append([_short_time(last["time"]), gpu, bus or "unknown", str(xid), name[:44],
                         last.get("action", ""), last.get("severity", ""),
                         str(sum(e.get("count", 1) for e in evs))])
        out("")
        for line in _table(rows, ["TIME (last)", "GPU", "BUS ID", "XID", "NAME", "ACTION", "SEVERITY", "COUNT"]):
            out(line)
    if doc["sxid_events"]:
        sg: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
        for s in doc["sxid_events"]:
            sg[(s["pci_bus_id"], s["sxid"])].append(s)
        rows = []
        for (bus, sxid), evs in sorted(sg.items(), key=lambda kv: (kv[1][-1]["epoch"] or 0, kv[0][0] or "")):
            last = evs[-1]
            fatal = {True: "fatal", False: "non-fatal", None: "?"}[last["fatal"]]
            link = "-" if last["link"] is None else str(last["link"])
            rows.append([_short_time(last["time"]), bus or "-", str(sxid), fatal, link, last["action"],
                         str(len(evs)), (last["text"] or "")[:40]])
        out("")
        for line in _table(rows, ["TIME (last)", "NVSWITCH", "SXID", "FATAL", "LINK", "ACTION", "COUNT", "TEXT"]):
            out(line)
    if doc["unrecognised"]:
        out("")
        out(f"Unrecognised Xid-like lines: {len(doc['unrecognised'])}")
        for u in doc["unrecognised"][:5]:
            out(f"  {u['raw'][:160]}")
    if not groups and not doc["sxid_events"] and read["ok"]:
        out(f"No Xid or SXid events {window['label']}.")
    out("")
    for text in _finding_lines(doc["results"]):
        out(text)
    out(_verdict_line(doc))


def _finding_lines(results: list[dict[str, Any]]) -> list[str]:
    """What is not a pass, one line each; its action once (an Xid's summary names it already)."""
    lines = []
    for r in results:
        if r["status"] == "pass":
            continue
        act = f" -> {r['action']}" if r["action"] != "none" and r["action"] not in r["summary"] else ""
        lines.append(f"{r['status'].upper():5}  {r['subject']}: {r['summary']}{act}")
    return lines


def _verdict_line(doc: dict[str, Any]) -> str:
    """One summary after the findings: 'Verdict: FAIL (exit 1): 1 Xid event(s), ...; action: reboot'."""
    what = "; ".join(r["summary"] for r in doc["results"] if r["status"] == "pass" and r["subject"] == "node")
    action = f"; action: {doc['action']}" if doc["action"] != "none" else ""
    return f"\nVerdict: {doc['status'].upper()} (exit {doc['exit_code']})" + (f": {what}" if what else "") + action


# -- --follow -------------------------------------------------------------------------------------

def _follow(source: str, files: tuple[str, ...], as_json: bool, no_nvml: bool) -> int:
    from ..platform.kernlog.follow import follow
    from ..xid.judge import classify, classify_sxid
    from ..platform.kernlog.parse import SXidEvent, XidEvent

    if len(files) > 1 or files == ("-",):
        raise click.UsageError("--follow reads one growing file (not stdin)")
    src = "file" if files else ("kmsg" if source == "auto" else source)
    if src not in ("kmsg", "journal", "file"):
        raise click.UsageError("--follow reads /dev/kmsg (default), --source journal, or --file FILE")
    lock = threading.Lock()

    def emit(item: Any, origin: str) -> None:
        if isinstance(item, XidEvent):
            c = classify(item)
            d = {"kind": "xid", "origin": origin, **item.to_dict(), "name": c.name,
                 "description": c.description, "severity": c.severity, "action": c.action}
            what = f"Xid {item.xid:<4}" if item.xid is not None else f"{item.signature} (no Xid)"
            text = (f"{_short_time(d['time'])}  {what} PCI {item.pci_bus_id or item.gpu_token or 'unknown'}  "
                    f"{c.description}  [{c.severity}, {c.action}]  ({origin})")
        elif isinstance(item, SXidEvent):
            sev, act = classify_sxid(item)
            d = {"kind": "sxid", "origin": origin, **item.to_dict(), "severity": sev, "action": act}
            fatal = {True: "fatal", False: "non-fatal", None: "?"}[item.fatal]
            text = (f"{_short_time(d['time'])}  SXid {item.sxid} NVSwitch {item.pci_bus_id or '-'}  {fatal}  "
                    f"{item.text[:60]}  [{sev}, {act}]  ({origin})")
        else:
            d = {"kind": "unrecognised", "origin": origin, **item.to_dict()}
            text = f"{_short_time(d['time'])}  unrecognised: {item.raw[:140]}  ({origin})"
        with lock:
            click.echo(json.dumps(d) if as_json else text)
            sys.stdout.flush()

    def note(msg: str) -> None:
        with lock:
            click.echo(f"{command()}: note: {msg}", err=True)

    stop = threading.Event()
    if not as_json:
        click.echo(f"Following {files[0] if files else src} for Xid/SXid events (Ctrl-C to stop)...", err=True)
    try:
        follow(emit, stop, source=src, file=files[0] if files else None, nvml=not no_nvml, on_note=note)
    except KeyboardInterrupt:
        stop.set()
        return 0
    except (OSError, ValueError) as e:
        what = files[0] if files else src
        from ..platform.kernlog.sources.base import DEFAULT_PATHS, oserror_text

        msg = oserror_text(e, what, DEFAULT_PATHS) if isinstance(e, OSError) else str(e)
        say_error(f"cannot follow {msg}")
        return 3
    return 0
