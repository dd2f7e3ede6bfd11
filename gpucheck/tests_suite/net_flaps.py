"""net.flaps: network links that go down and up, from the kernel log and the port counters.

- The kernel log's link changes within `window` (default 1h): mlx5 and other netdevs' "Link
  down"/"Link up", carrier lost/gained (systemd-networkd, IPoIB). A flap is a down/up cycle: the
  larger of the downs and the ups of one interface (a log that kept only the ups still counts).
  A line whose time cannot be placed counts (unknown, never old).
- The `link_downed` counter's growth since the previous run of this check (history keyed by port;
  saturated at 255: no delta) adds to the port's flaps; `link_error_recovery` growth warns.
- A rail with `flaps_fail` flaps or more: fail, drain; `flaps_warn` or more: warn. A port that is
  not a rail (a management NIC) warns at most. An interface no port maps to is a rail when it is
  IPoIB (ibN: an InfiniBand port), else not.
A node without RDMA hardware and without link events: skip. The kernel log unreadable live on a
node with RDMA hardware: error.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from typing import Any, TypedDict

from ..platform.durations import parse_duration
from ..platform.kernlog.netevents import LinkEvent
from ..platform.kernlog.netscan import NetScan, scan_for
from ..platform.net.model import NetPort, NetPorts
from ..platform.net.record import net_in
from ..platform.net.rails import hardware_ports, select_rails
from ..sdk import (nvml_unjudged, Action, Context, Key, Level, Limit, Result, Rule, Status, define, evaluate, latest_metrics_by,
                   previous_interval, settle, snapshot_time)

ID = "net.flaps"


class FlapParams(TypedDict):
    window: str  # a duration: link events older than this are not counted
    flaps_warn: float
    flaps_fail: float
    recovery_warn: float  # link_error_recovery growth above this: warn
    rails: list[str]  # as net.ports' rails ([]: inferred)
    max_evidence_lines: int


DEFAULTS: FlapParams = {"window": "1h", "flaps_warn": 2, "flaps_fail": 3, "recovery_warn": 0, "rails": [],
                        "max_evidence_lines": 6}


def _window(text: str) -> str:
    parse_duration(text)  # ValueError: not a duration
    return text


LIMITS = {"window": Limit("str", parse=_window, words="a duration (30m, 1h)"),
          "flaps_warn": Limit("real", 1), "flaps_fail": Limit("real", 1), "recovery_warn": Limit("real", 0),
          "rails": Limit("list", item="str"), "max_evidence_lines": Limit("int", 1)}
RULES = (
    Rule("flaps", ">=", Key("flaps_fail"), Status.FAIL, Action.DRAIN,
         "{subject_text} flapped {value} time(s) ({detail}: {how})"),
    Rule("flaps", ">=", Key("flaps_warn"), Status.WARN, Action.INVESTIGATE,
         "{subject_text} flapped {value} time(s) ({detail}: {how})"),
    Rule("link_error_recovery_growth", ">", Key("recovery_warn"), Status.WARN, Action.INVESTIGATE,
         "{subject_text}: link error recoveries rising ({value} since the previous run)", "count"),
)
LINK_DOWNED_MAX = 0xFF  # 8-bit IB counter
IPOIB = re.compile(r"^ib\d")


def log_flaps(events: list[LinkEvent]) -> int:
    downs = sum(1 for e in events if not e.up)
    ups = len(events) - downs
    return max(downs, ups) if downs or ups > 1 else 0


def in_window(events: list[LinkEvent], start: float | None) -> list[LinkEvent]:
    return [e for e in events if e.time is None or start is None or e.time >= start]


def counter_growth(port: NetPort, prev: Any, name: str, now: float | None) -> tuple[int | None, str | None]:
    """A counter's growth since the previous run, or (None, why not)."""
    interval, why = previous_interval(prev, now)
    v = port["counters"].get(name)
    if name not in port["counters"]:
        return None, None
    if v is None:
        return None, f"{name} not available"
    if v >= LINK_DOWNED_MAX and name == "link_downed":
        return None, f"link_downed saturated at {v} (no delta: clear the counters to judge it again)"
    if interval is None:
        return None, f"{name} {v} since driver load; no delta ({why})"
    before = (prev[0].get("counters") or {}).get(name)
    if not isinstance(before, int) or v < before:
        return None, f"{name}: no usable previous value"
    return v - before, None


def judge_subject(subject: str, rail: bool, events: list[LinkEvent], port: NetPort | None, prev: Any,
                  now: float | None, p: FlapParams) -> Result:
    """One port or interface -> its result."""
    downed, why_downed = counter_growth(port, prev, "link_downed", now) if port else (None, None)
    recov, why_recov = counter_growth(port, prev, "link_error_recovery", now) if port else (None, None)
    from_log = log_flaps(events)
    flaps = from_log + (downed or 0)
    how = ", ".join(x for x in (f"{from_log} in the kernel log within {p['window']}" if events else "",
                                f"link_downed +{downed}" if downed else "") if x) or "none"
    text = f"{'rail' if rail else 'port (not a rail)'} {subject}"
    m = {"port": subject, "rail": rail, "flaps": flaps, "log_flaps": from_log, "link_downed_growth": downed,
         "link_error_recovery_growth": recov, "snapshot_time": now,
         "counters": {k: v for k, v in (port["counters"] if port else {}).items()
                      if k in ("link_downed", "link_error_recovery")}}
    limits = {"flaps_fail": p["flaps_fail"] if rail else None, "flaps_warn": p["flaps_warn"],
              "recovery_warn": p["recovery_warn"]}
    r = evaluate(ID, RULES, m, limits=limits, facts={"subject_text": text, "how": how}, subject=subject,
                 units={"flaps": "count", "link_error_recovery_growth": "count"},
                 ok_summary=f"{text}: {flaps} flap(s) ({how})")
    r.evidence += [e.line for e in events[-p["max_evidence_lines"]:]]
    r.evidence += [w for w in (why_downed, why_recov) if w]
    return r


def _events_by_iface(scan: NetScan, start: float | None) -> dict[str, list[LinkEvent]]:
    by: dict[str, list[LinkEvent]] = defaultdict(list)
    for e in in_window(scan.events.links, start):
        by[e.iface].append(e)
    return by


def judge_flaps(net: Any, scan: NetScan, p: FlapParams, history: dict[Any, Any], now: float | None) -> list[Result]:
    ports_doc: NetPorts = {"source": "", "error": None, "ports": (net or {}).get("ports") or [], "notes": [],
                           "gpu_pci_chains": (net or {}).get("gpu_pci_chains") or {}}
    ports = hardware_ports(ports_doc)
    rails = select_rails({**ports_doc, "ports": ports}, p["rails"] or None)
    start = None if now is None else now - parse_duration(p["window"])
    by_iface = _events_by_iface(scan, start)
    out = []
    for q in ports:
        events = by_iface.pop(q["netdev"], []) if q["netdev"] else []
        if q["key"] in rails.keys or events:
            out.append(judge_subject(q["key"], q["key"] in rails.keys, events, q, history.get(q["key"]), now, p))
    if scan.absent:  # a capture without a kernel log: only counter deltas say anything
        out = [r for r in out if r.metrics.get("link_downed_growth") is not None]
    quiet = []
    for iface, events in sorted(by_iface.items()):
        if log_flaps(events) or IPOIB.match(iface):
            out.append(judge_subject(iface, bool(IPOIB.match(iface)), events, None, None, now, p))
        else:
            quiet.append(iface)
    if not out:
        return [_nothing(net, ports, scan, quiet, p)]
    for r in out:
        if scan.error and ports:
            r.unjudged["kernel log"] = Status.ERROR
            r.evidence.append(f"kernel log not read: {scan.error}")
            before = r.status
            settle(r)
            if r.status != before:
                r.summary = f"could not read the kernel log ({scan.error}); {r.summary}"
        elif scan.absent:
            r.evidence.append("kernel log not in this capture: counters only")
    return out


def _nothing(net: Any, ports: list[NetPort], scan: NetScan, quiet: list[str], p: FlapParams) -> Result:
    """No rail and no flapping interface: a skip (no RDMA hardware, nothing in the capture), an
    error (the kernel log could not be read), or a pass (the log was read and shows no flap)."""
    if scan.error:
        return Result(ID, Status.ERROR, f"could not judge: {scan.error}")
    if scan.absent:
        return Result(ID, Status.SKIP, "kernel log not in this capture (add dmesg)")
    if net is not None and not ports and not quiet:
        return Result(ID, Status.SKIP, "no RDMA hardware and no link events")
    r = evaluate(ID, RULES, {"flaps": 0}, limits={"flaps_warn": p["flaps_warn"], "flaps_fail": None, "recovery_warn": None},
                 ok_summary=f"no link flap in the kernel log within {p['window']}" +
                 (f" (one change each on {', '.join(quiet)})" if quiet else "") +
                 ("" if net is not None else "; RDMA ports not in this capture"))
    return r


@define(ID, title="Link flaps: kernel-log link changes and link_downed growth", level=Level.QUICK, needs=(),
        budget_s=10.0, detects="network links going down and up (cables, transceivers, switch ports)",
        defaults=DEFAULTS, limits=LIMITS)
def net_flaps(ctx: Context) -> list[Result]:
    unjudged = nvml_unjudged(ID, ctx.snapshot or {})  # the snapshot itself could not be read
    if unjudged is not None:
        return [unjudged]
    net, p = net_in(ctx.snapshot), ctx.params(ID, DEFAULTS)
    now = snapshot_time(ctx) if ctx.options.snapshot_path else time.time()
    scan = scan_for(ctx.snapshot or {}, replayed=bool(ctx.options.snapshot_path), captured_at=now,
                    since=None if now is None else now - parse_duration(p["window"]))
    if net is not None and net.get("error"):
        return [Result(ID, Status.ERROR, f"could not judge: {net['error']}")]
    return judge_flaps(net, scan, p, latest_metrics_by(ctx, ID, "port"), now)


CHECKS = [net_flaps]
