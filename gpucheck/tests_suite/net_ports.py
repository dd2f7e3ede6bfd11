"""net.ports: the node's InfiniBand / RoCE ports (/sys/class/infiniband, or a recorded capture).

- A rail port that is not ACTIVE (Down, Polling, Initializing, Armed) or not physically LinkUp:
  fail, drain (a job's traffic over that rail stops or falls back).
- A rail below the rate or width the node's rails should run: the configured
  `expected_rate_gbps`, else the majority of the node's own active rails (a lone slow rail is
  found; a node whose rails all run slow is only found with the expected rate configured, and
  the summary says so).
- The error counters of a rail (symbol_error, port_rcv_errors, ...) rising since the previous
  run of this check (history in the state directory, keyed by port): warn. A counter at its
  maximum is saturated: no delta is taken from it ("saturated", never new errors); a counter the
  device does not provide ("N/A (no PMA)") is not available, never 0.
- Which ports are rails: the config's `rails`, else the NICs under the GPUs' PCIe switches, else
  the node's largest class of alike ports (gpucheck.platform.net.rails). Other ports (a
  management or frontend NIC) are reported and never fail the node.
A node without RDMA hardware: skip. A source that could not be read: error.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, TypedDict

from ..platform.net.model import UNKNOWN, NetPort, NetRecord
from ..platform.net.record import net_in
from ..platform.net.rails import Rails, hardware_ports, select_rails
from ..sdk import (nvml_unjudged, Action, Context, Key, Level, Limit, Result, Rule, Status, define, evaluate, latest_metrics_by,
                   previous_interval, settle, snapshot_time)

ID = "net.ports"


class NetPortsParams(TypedDict):
    rails: list[str]  # devices, ports ("mlx5_0/1") or netdevs; [] = from PCI topology or port classes
    expected_rate_gbps: float  # 0: the majority of the node's active rails
    error_growth_warn: float  # error counters' growth since the previous run above this: warn


DEFAULTS: NetPortsParams = {"rails": [], "expected_rate_gbps": 0, "error_growth_warn": 0}
LIMITS = {"rails": Limit("list", item="str"), "expected_rate_gbps": Limit("real", 0),
          "error_growth_warn": Limit("real", 0)}
# The IB error counters judged for growth, and their widths (IBA PortCounters: a counter stops at
# its maximum; one read at it gives no delta).
ERROR_COUNTERS = {"symbol_error": 0xFFFF, "port_rcv_errors": 0xFFFF, "port_rcv_remote_physical_errors": 0xFFFF,
                  "local_link_integrity_errors": 0xF, "excessive_buffer_overrun_errors": 0xF}
ACTIVE_STATES = ("ACTIVE", "ACTIVE_DEFER")
RULES = (
    Rule("active", "<", 1, Status.FAIL, Action.DRAIN, "rail {port} is {state} (not ACTIVE)"),
    Rule("link_up", "<", 1, Status.FAIL, Action.DRAIN, "rail {port} physical state {phys} (not LinkUp)"),
    Rule("rate_gbps", "<", Key("expected_rate_gbps"), Status.FAIL, Action.INVESTIGATE,
         "rail {port} at {value} Gb/s, below the {limit} Gb/s {expected_from}", "Gb/s"),
    Rule("width_lanes", "<", Key("expected_width_lanes"), Status.FAIL, Action.INVESTIGATE,
         "rail {port} at {value}X width, below {limit}X ({expected_from})", "lanes"),
    Rule("error_counter_growth", ">", Key("error_growth_warn"), Status.WARN, Action.INVESTIGATE,
         "rail {port}: error counters rising since the previous run ({grown})", "count"),
)

ABSENT_RULES = (Rule("present", "<", 1, Status.FAIL, Action.DRAIN, "configured rail {rail} is not on this node"),)


@dataclass(frozen=True)
class Expected:
    rate_gbps: float | None
    width_lanes: int | None
    rate_from: str


def _lanes(width: str | None) -> int | None:
    return int(width[:-1]) if width and width.endswith("X") and width[:-1].isdigit() else None


def expected_of(rails: list[NetPort], p: NetPortsParams) -> Expected:
    """The rate and width the rails should run: configured, else the majority of the active rails."""
    active = [r for r in rails if r["state"] in ACTIVE_STATES]
    widths = Counter(w for w in (_lanes(r["width"]) for r in active) if w is not None)
    width = widths.most_common(1)[0][0] if widths else None
    if p["expected_rate_gbps"]:
        return Expected(float(p["expected_rate_gbps"]), width, "configured expected_rate_gbps")
    rates = Counter(r["rate_gbps"] for r in active if r["rate_gbps"] is not None)
    if not rates:
        return Expected(None, width, "no active rail reports a rate")
    rate, n = rates.most_common(1)[0]
    return Expected(rate, width, f"majority of the node's active rails ({n} of {len(active)}; "
                                 "no expected_rate_gbps configured)")


def counter_deltas(now: dict[str, int | None], before: dict[str, Any] | None) -> tuple[int | None, list[str]]:
    """(the error counters' growth since `before`, notes: which grew, saturated, not available)."""
    if before is None:
        return None, []
    total, notes = 0, []
    for name, top in ERROR_COUNTERS.items():
        v, prev = now.get(name), before.get(name)
        if name not in now:
            continue
        if v is None:
            notes.append(f"{name} not available")
        elif v >= top:
            notes.append(f"{name} saturated at {v} (no delta: clear the counters to judge it again)")
        elif isinstance(prev, int) and v >= prev:
            total += v - prev
            if v > prev:
                notes.append(f"{name} +{v - prev}")
        elif isinstance(prev, int):
            notes.append(f"{name} went back from {prev} to {v} (counters cleared)")
    return total, notes


def mark_unjudged(r: Result, field: str, status: Status, why: str) -> None:
    """`field` could not be examined: `status` (ERROR: the result cannot pass; WARN: a pass
    becomes a warn), named in the summary and the evidence."""
    r.unjudged[field] = status
    r.evidence.append(why)
    before = r.status
    settle(r)
    if r.status != before:
        r.summary = f"{why}; {r.summary}"


def _metrics(port: NetPort, growth: int | None, now: float | None) -> dict[str, Any]:
    active = port["state"] in ACTIVE_STATES
    known_state = port["state"] not in (None, UNKNOWN)
    return {
        "port": port["key"], "rail": True, "state": port["state"], "phys_state": port["phys_state"],
        "active": (1 if active else 0) if known_state else None,
        "link_up": (1 if port["phys_state"] == "LinkUp" else 0) if port["phys_state"] not in (None, UNKNOWN) else None,
        "rate_gbps": port["rate_gbps"] if active else None,
        "width_lanes": _lanes(port["width"]) if active else None,
        "link_layer": port["link_layer"], "counters": dict(port["counters"]),
        "error_counter_growth": growth, "snapshot_time": now,
    }


def judge_rail(port: NetPort, exp: Expected, p: NetPortsParams, prev: Any, now: float | None) -> Result:
    """One rail port -> its result."""
    interval, why_no_interval = previous_interval(prev, now)
    growth, notes = counter_deltas(port["counters"], prev[0].get("counters") if prev and interval is not None else None)
    m = _metrics(port, growth, now)
    facts = {"port": port["key"], "state": port["state_text"] or port["state"], "phys": port["phys_state_text"],
             "grown": ", ".join(n for n in notes if "+" in n) or None, "expected_from": exp.rate_from}
    limits = {"expected_rate_gbps": exp.rate_gbps, "expected_width_lanes": exp.width_lanes,
              "error_growth_warn": p["error_growth_warn"]}
    what = f"{port['link_layer'] or 'link layer not shown'}, {port['rate_text'] or 'rate not shown'}"
    r = evaluate(ID, RULES, m, limits=limits, facts=facts, subject=port["key"],
                 units={"rate_gbps": "Gb/s", "width_lanes": "lanes", "error_counter_growth": "count"},
                 ok_summary=f"rail {port['key']}: {port['state']}/{port['phys_state'] or '-'} ({what})")
    r.evidence += [f"{n}" for n in notes if "+" not in n]
    if exp.rate_gbps is not None:
        r.evidence.append(f"expected rate {exp.rate_gbps:g} Gb/s: {exp.rate_from}")
    if growth is None and port["counters"]:
        r.evidence.append(f"error counters since driver load; no delta ({why_no_interval})")
    for problem in port["problems"]:
        field = problem.split()[0]
        mark_unjudged(r, field, Status.ERROR if field in ("state", "phys_state") else Status.WARN,
                      f"{port['key']}: {problem} does not parse")
    if port["state"] is None:
        mark_unjudged(r, "state", Status.ERROR, f"{port['key']}: state not in this capture")
    if exp.rate_gbps is not None and port["rate_gbps"] is None and port["state"] in ACTIVE_STATES:
        r.evidence.append(f"{port['key']}: rate not in this capture (ibstat, ibstatus or sysfs show it)")
        if r.status == Status.PASS:
            r.summary += "; rate not in this capture"
    return r


def _others(ports: list[NetPort], rails: Rails) -> Result | None:
    """The ports that are not rails, reported, never failing the node."""
    others = [q for q in ports if q["key"] not in rails.keys]
    if not others:
        return None
    words = [f"{q['key']} {q['state'] or '?'}/{q['phys_state'] or '?'}" for q in others]
    down = [q["key"] for q in others if q["state"] not in ACTIVE_STATES]
    text = f"{len(others)} port(s) not rails, not judged: {', '.join(words)}"
    r = Result(ID, Status.PASS, text + (f" ({len(down)} not active)" if down else ""), subject="other ports",
               evidence=[f"rails: {rails.how}"])
    for q in others:  # a state that does not parse is never read as healthy, rail or not
        for problem in q["problems"]:
            mark_unjudged(r, f"{q['key']} {problem.split()[0]}", Status.WARN, f"{q['key']}: {problem} does not parse")
    return r


NOT_IN_CAPTURE = "RDMA ports not in this capture (add ibstat or /sys/class/infiniband)"


def _absent(rails: Rails, net: NetRecord) -> list[Result]:
    """Configured rails the source does not show: on a live node the NIC is gone (fail); in a
    capture it may just not be in it (error)."""
    out = []
    for name in rails.absent:
        if net.get("source") == "sysfs":
            r = evaluate(ID, ABSENT_RULES, {"rail": name, "present": 0}, facts={"rail": name}, subject=name,
                         ok_summary="")
            r.evidence.append(f"rails: {rails.how}")
            out.append(r)
        else:
            out.append(Result(ID, Status.ERROR, f"configured rail {name} not in this capture", subject=name))
    return out


def _incomplete(net: NetRecord) -> Result | None:
    notes = net.get("notes") or []
    if not notes:
        return None
    r = Result(ID, Status.PASS, "capture incomplete", subject="capture")
    for i, n in enumerate(notes):
        mark_unjudged(r, f"note{i}", Status.WARN, n)
    return r


def judge_net(net: NetRecord, p: NetPortsParams, history: dict[Any, Any], now: float | None) -> list[Result]:
    """The node's ports -> results: one per rail, one for the other ports, one per absent rail."""
    if net.get("error"):
        return [Result(ID, Status.ERROR, f"could not judge: {net['error']}")]
    ports = hardware_ports({"source": net.get("source", "?"), "error": None, "ports": net.get("ports") or [],
                            "notes": [], "gpu_pci_chains": net.get("gpu_pci_chains") or {}})
    if not ports:
        soft = [q["key"] for q in net.get("ports") or []]
        return [Result(ID, Status.SKIP, "no RDMA hardware on this node" +
                       (f" (only software RDMA devices: {', '.join(soft)})" if soft else ""))]
    rails = select_rails({"source": net.get("source", "?"), "error": None, "ports": ports, "notes": [],
                          "gpu_pci_chains": net.get("gpu_pci_chains") or {}}, p["rails"] or None)
    rail_ports = [q for q in ports if q["key"] in rails.keys]
    exp = expected_of(rail_ports, p)
    out = [judge_rail(q, exp, p, history.get(q["key"]), now) for q in rail_ports]
    for r in out:
        r.evidence.append(f"rails: {rails.how}")
    out += _absent(rails, net)
    extra = [x for x in (_others(ports, rails), _incomplete(net)) if x is not None]
    return out + extra


@define(ID, title="InfiniBand / RoCE rails: state, rate, error counters", level=Level.QUICK, needs=(),
        budget_s=5.0, detects="rail ports down, polling or initializing; rails at a lower rate or width; "
                              "error counters rising", defaults=DEFAULTS, limits=LIMITS)
def net_ports(ctx: Context) -> list[Result]:
    unjudged = nvml_unjudged(ID, ctx.snapshot or {})  # the snapshot itself could not be read
    if unjudged is not None:
        return [unjudged]
    net = net_in(ctx.snapshot)
    if net is None:
        return [Result(ID, Status.SKIP, NOT_IN_CAPTURE)]
    p = ctx.params(ID, DEFAULTS)
    return judge_net(net, p, latest_metrics_by(ctx, ID, "port"), snapshot_time(ctx))


CHECKS = [net_ports]
