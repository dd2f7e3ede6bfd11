"""Events -> Results (pure: no I/O, no clock).

Per GPU (or per unmapped PCI address, or per NVSwitch):

- any critical event in the window       -> fail, with the strongest action of those events
- any warning-class event                 -> warn, with its action
- the same application-class Xid more than `repeat_limit` times on one GPU -> warn "investigate"
- application-class and informational events alone -> pass (shown as evidence)

Plus one node-level result that says what was read and which window was judged (and warns on
Xid-like lines that match no known form). An unreadable log is an `error`, never a `pass`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, TypedDict

from ..core.result import Action, Key, Result, Rule, Status, evaluate, strongest_action
from ..platform.kernlog.mapping import GpuInfo, GpuMap
from ..platform.kernlog.parse import SXidEvent, Unrecognised, XidEvent
from ..platform.kernlog.timeparse import iso_utc
from . import catalog

_SEV_RANK = {"critical": 0, "warning": 1, "app": 2, "info": 3}

class XidParams(TypedDict):
    """The xid check's parameters (DEFAULT_PARAMS, merged with the config's [checks.xid])."""

    since: str  # the window (gpucheck.platform.kernlog.timeparse.validate_since)
    source: str  # where the kernel log is read (gpucheck.platform.kernlog.sources.selection.SOURCES)
    files: list[str]
    repeat_limit: int
    ignore_xids: list[int]
    unrecognised_warn: bool
    max_evidence_lines: int
    read_timeout_s: float


class ClassificationDoc(TypedDict):
    """A Classification as `gpucheck xid` writes it."""

    severity: str
    action: str
    name: str
    description: str
    bucket: str
    note: str
    known: bool


DEFAULT_PARAMS: XidParams = {
    "since": "last-pass",
    "source": "auto",
    "files": [],
    "repeat_limit": 2,
    "ignore_xids": [],
    "unrecognised_warn": True,
    "max_evidence_lines": 20,
    "read_timeout_s": 8.0,
}


@dataclass(frozen=True)
class Classification:
    severity: str  # critical, warning, app, info
    action: str  # an Action value
    name: str  # NVIDIA's mnemonic, or "unknown Xid N"
    description: str
    bucket: str  # NVIDIA's immediate-action bucket
    note: str = ""
    known: bool = True

    def to_dict(self) -> ClassificationDoc:
        return {"severity": self.severity, "action": self.action, "name": self.name,
                "description": self.description, "bucket": self.bucket, "note": self.note,
                "known": self.known}


def classify(ev: XidEvent, ignore: Iterable[int] = ()) -> Classification:
    """What one Xid event means on its own (see `classify_all` for the rules between events)."""
    if ev.xid is None:  # a fault signature without an Xid number
        sev, act, desc, note = catalog.SIGNATURES[str(ev.signature)]
        return Classification(sev, act, str(ev.signature), desc, "", note, True)
    e = catalog.lookup(ev.xid)
    sev, act, note = e.severity, e.action, e.note
    if ev.xid in catalog.NVLINK5_XIDS and ev.nvlink and ev.nvlink.get("fatal") is False:
        sev, act = catalog.NVLINK5_NONFATAL
        link = ev.nvlink.get("link")
        note = f"non-fatal {ev.nvlink.get('unit') or 'NVLink'} event" + (f" on link {link}" if link is not None else "")
    elif ev.xid in catalog.NVLINK5_XIDS and ev.nvlink:
        link = ev.nvlink.get("link")
        note = f"fatal {ev.nvlink.get('unit') or 'NVLink'} event" + (f" on link {link}" if link is not None else "")
    if ev.xid == 154:
        rec = ev.recovery
        to_label, to_code = (rec.get("to_label"), rec.get("to_code")) if rec else (None, None)
        label = (to_label or "").strip().lower()
        verdict = catalog.RECOVERY_ACTIONS.get(label)
        if verdict is None and isinstance(to_code, int):
            verdict = catalog.RECOVERY_ACTIONS.get(catalog.RECOVERY_CODES.get(to_code, ""))
        if verdict is not None:
            sev, act = verdict
            note = f"the driver's recovery action is now {to_label or hex(to_code or 0)}"
        else:
            sev, act = "warning", "investigate"
            note = "recovery action not readable from the message"
    if ev.implied:
        note = (note + "; " if note else "") + "bus loss reported without an Xid number (implied Xid 79)"
    if ev.xid in set(ignore):
        sev, act = "info", "none"
        note = "ignored by configuration (ignore_xids)"
    return Classification(sev, act, e.mnemonic, e.description, e.bucket, note, e.known)


def subject_key(ev: XidEvent | SXidEvent, gpu_map: GpuMap) -> tuple[str, Any]:
    """("gpu", index), ("pci", bus id), or ("unknown", how the line names the GPU) for an event
    whose line has no PCI address ("GPU unknown": counted, never dropped)."""
    g = gpu_map.lookup(ev.pci_bus_id)
    if g is not None and g.index is not None:
        return ("gpu", g.index)
    if ev.pci_bus_id:
        return ("pci", ev.pci_bus_id)
    return ("unknown", getattr(ev, "gpu_token", None) or "")


def classify_all(events: list[XidEvent], gpu_map: GpuMap, ignore: Iterable[int] = ()) -> dict[int, Classification]:
    """id(event) -> classification, with the co-occurrence rules of the catalog applied per GPU
    (Xid 48 with 63/64 on the same GPU: drain and reset)."""
    ignore = set(ignore)
    out = {id(ev): classify(ev, ignore) for ev in events}
    by_subject: dict[tuple[str, Any], list[XidEvent]] = defaultdict(list)
    for ev in events:
        by_subject[subject_key(ev, gpu_map)].append(ev)
    for evs in by_subject.values():
        present = {ev.xid for ev in evs}
        for rule in catalog.CO_OCCURRENCE:
            xid, others = rule["xid"], rule["with"]
            if xid in present and present & others and xid not in ignore:  # type: ignore[operator]
                for ev in evs:
                    if ev.xid == xid:
                        c = out[id(ev)]
                        out[id(ev)] = Classification(c.severity, str(rule["action"]), c.name, c.description,
                                                     c.bucket, str(rule["note"]), c.known)
    return out


def classify_sxid(ev: SXidEvent) -> tuple[str, str]:
    if ev.fatal is True:
        return catalog.SXID_FATAL
    if ev.fatal is False:
        return catalog.SXID_NONFATAL
    return catalog.SXID_UNKNOWN


# -- results ------------------------------------------------------------------------------------
# A GPU's (or PCI address's) events: the actions are the catalog's, strongest among the events of
# the rule's severity. The summary names every Xid kind, most severe first.
XID_RULES = (
    Rule("critical_events", ">", 0, Status.FAIL, Key("critical_action"), "{xid_kinds}", "count"),
    Rule("warning_events", ">", 0, Status.WARN, Key("warning_action"), "{xid_kinds}", "count"),
    Rule("app_repeat_max", ">", Key("repeat_limit"), Status.WARN, Action.INVESTIGATE, "{xid_kinds}", "count"),
)
SXID_RULES = (
    Rule("fatal_sxids", ">", 0, Status.FAIL, Action(catalog.SXID_FATAL[1]), "{sxid_findings}", "count"),
    Rule("nonfatal_repeat_max", ">", Key("repeat_limit"), Status.WARN, Action.INVESTIGATE, "{sxid_findings}", "count"),
    Rule("unknown_fatality_sxids", ">", 0, Status.WARN, Action.INVESTIGATE, "{sxid_findings}", "count"),
)
# Xid-like lines of no known form warn (investigate) unless unrecognised_warn is off: then the
# threshold is listed with status pass.
NODE_RULES = (
    Rule("unrecognised_lines", ">", Key("unrecognised_warn_limit"), Status.WARN, Action.INVESTIGATE, "{read}", "count"),
    Rule("unrecognised_lines", ">", Key("unrecognised_pass_limit"), Status.PASS, Action.NONE, "{read}", "count"),
)


def _evidence(lines: list[str], limit: int) -> list[str]:
    if len(lines) <= limit:
        return lines
    return lines[:limit] + [f"... and {len(lines) - limit} more line(s)"]


def _xid_group_result(check: str, key: tuple[str, Any], evs: list[XidEvent], cls: dict[int, Classification],
                      info: GpuInfo | None, limit: int, max_lines: int) -> Result:
    sev_counts: Counter[str] = Counter(cls[id(e)].severity for e in evs)
    # "app" is an Xid's severity (a fault signature without an Xid number is never one)
    app_counts: Counter[int] = Counter(e.xid for e in evs if e.xid is not None and cls[id(e)].severity == "app")
    app_repeat_max = max(app_counts.values(), default=0)
    repeated = {x: n for x, n in app_counts.items() if n > limit}
    parts = _xid_kinds(evs, cls, limit, repeated)
    kinds = "; ".join(parts[:4]) + (f"; and {len(parts) - 4} more Xid kinds" if len(parts) > 4 else "")
    ordered = sorted(evs, key=lambda e: (_SEV_RANK[cls[id(e)].severity], e.seq))
    lines: list[str] = []
    bus = info.pci_bus_id if info else evs[0].pci_bus_id
    ident = [f"PCI {bus}" if bus else "no PCI address in the log"]
    if info is not None and info.uuid:
        ident.append(info.uuid)
    if info is not None and info.serial:
        ident.append(f"serial {info.serial}")
    lines.append(", ".join(ident))
    for e in ordered:
        lines.append(e.raw)
        lines.extend(e.related)
    gpu = key[1] if key[0] == "gpu" else None
    prefix, subject = _subject(key, gpu)
    metrics = {"events": len(evs), "critical_events": sev_counts.get("critical", 0),
               "warning_events": sev_counts.get("warning", 0), "app_events": sev_counts.get("app", 0),
               "app_repeat_max": app_repeat_max, "info_events": sev_counts.get("info", 0),
               "pci_bus_id": info.pci_bus_id if info else evs[0].pci_bus_id, "uuid": info.uuid if info else None}
    limits = {"repeat_limit": limit,
              "critical_action": strongest_action(Action(cls[id(e)].action) for e in evs
                                                  if cls[id(e)].severity == "critical"),
              "warning_action": strongest_action(Action(cls[id(e)].action) for e in evs
                                                 if cls[id(e)].severity == "warning")}
    r = evaluate(check, XID_RULES, metrics, limits=limits, facts={"xid_kinds": kinds}, prefix=prefix, gpu=gpu,
                 subject=subject,
                 units={k: "count" for k in metrics if k not in ("pci_bus_id", "uuid")},
                 ok_summary=prefix + "no hardware fault: " + "; ".join(parts))
    r.evidence = _evidence(lines, max_lines)
    return r


def _subject(key: tuple[str, Any], gpu: int | None) -> tuple[str, str | None]:
    """The summary prefix and the subject of a group of events (None: the GPU's own subject)."""
    if gpu is not None:
        return f"GPU {gpu}: ", None
    if key[0] == "pci":
        return f"PCI {key[1]} (no GPU index known): ", f"pci:{key[1]}"
    prefix = (f"GPU unknown (the log names it {key[1]!r}, not by PCI address): " if key[1]
              else "GPU unknown (the log names no PCI address): ")
    return prefix, "gpu:unknown" + (f":{key[1]}" if key[1] else "")


def _xid_kinds(evs: list[XidEvent], cls: dict[int, Classification], limit: int, repeated: dict[int, int]) -> list[str]:
    """One summary part per Xid number (or fault signature), most severe first."""
    per_xid: dict[int | str, list[XidEvent]] = defaultdict(list)  # Xid number, or signature name
    for e in evs:
        per_xid[e.kind].append(e)

    def rank(x: int | str) -> tuple[int, float]:
        worst = min(_SEV_RANK[cls[id(e)].severity] for e in per_xid[x])
        first = min((e.time for e in per_xid[x] if e.time is not None), default=0.0)
        return worst, first

    parts = []
    for x in sorted(per_xid, key=rank):
        group = per_xid[x]
        c = cls[id(group[-1])]
        worst = min((cls[id(e)] for e in group), key=lambda k: _SEV_RANK[k.severity])
        last = max((e.time for e in group if e.time is not None), default=None)
        when = f", last {iso_utc(last)}" if last is not None else ""
        label = c.description if c.description and c.description != "Unused" else c.name
        head = f"Xid {x} {label}" if isinstance(x, int) else label
        if worst.severity in ("critical", "warning"):
            extra = f": {worst.action}" + (f" ({worst.note})" if worst.note else "")
        elif worst.severity == "app":
            extra = (f": repeats more than {limit} times on one GPU, investigate" if x in repeated
                     else ": application-class (restart-app)")
        else:
            extra = ": informational"
        parts.append(f"{head} x{len(group)}{when}{extra}")
    return parts


def _sxid_group_result(check: str, bus: str, evs: list[SXidEvent], limit: int, max_lines: int) -> Result:
    fatal = [e for e in evs if e.fatal is True]
    unknown = [e for e in evs if e.fatal is None]
    nonfatal = Counter(e.sxid for e in evs if e.fatal is False)
    repeated = {x: n for x, n in nonfatal.items() if n > limit}
    parts = []
    for e in fatal[:3]:
        parts.append(f"fatal SXid {e.sxid} ({e.text or 'no detail'}): reset the baseboard's GPUs and "
                     "NVSwitches (reboot)")
    if len(fatal) > 3:
        parts.append(f"and {len(fatal) - 3} more fatal SXids")
    for x, n in sorted(repeated.items()):
        parts.append(f"non-fatal SXid {x} x{n}, more than {limit}: investigate")
    if unknown:
        parts.append(f"{len(unknown)} SXid report(s) of unknown fatality: investigate")
    ok = "non-fatal only: " + ", ".join(f"SXid {x} x{n}" for x, n in sorted(nonfatal.items()))
    switches = sorted({e.switch for e in evs if e.switch is not None})
    lines = [f"NVSwitch PCI {bus}" + (f" (nvidia-nvswitch{switches[0]})" if len(switches) == 1 else "")]
    for e in sorted(evs, key=lambda e: (e.fatal is not True, e.seq)):
        lines.extend(e.raw)
    metrics = {"sxid_events": len(evs), "fatal_sxids": len(fatal), "nonfatal_repeat_max": max(nonfatal.values(), default=0),
               "unknown_fatality_sxids": len(unknown)}
    r = evaluate(check, SXID_RULES, metrics, limits={"repeat_limit": limit}, facts={"sxid_findings": "; ".join(parts)},
                 units=dict.fromkeys(metrics, "count"), ok_summary=ok, subject=f"nvswitch:{bus}")
    r.evidence = _evidence(lines, max_lines)
    return r


def error_result(check: str, why: str, attempts: Iterable[Any] = ()) -> Result:
    return Result(check, Status.ERROR, why,
                  evidence=[f"tried {a}" for a in attempts] + [
                      "no Xid verdict: an unread log is not a healthy log"])


def judge(
    *,
    check: str,
    events: list[XidEvent],
    sxid_events: list[SXidEvent],
    unrecognised: list[Unrecognised],
    gpu_map: GpuMap,
    params: XidParams,
    read_summary: str,
    window_label: str,
    notes: Iterable[str] = (),
    selection: Iterable[int] | None = None,
    inventory: Iterable[GpuInfo] = (),
    classes: dict[int, Classification] | None = None,
) -> list[Result]:
    """All results of the xid check for events that were read successfully."""
    limit = int(params.get("repeat_limit", DEFAULT_PARAMS["repeat_limit"]))
    max_lines = int(params.get("max_evidence_lines", DEFAULT_PARAMS["max_evidence_lines"]))
    ignore = [int(x) for x in params.get("ignore_xids", []) or []]
    sel = set(selection) if selection is not None else None
    cls = classes if classes is not None else classify_all(events, gpu_map, ignore)
    groups, excluded = _group_by_subject(events, gpu_map, sel)
    sx_groups: dict[str, list[SXidEvent]] = defaultdict(list)
    for sx in sxid_events:
        sx_groups[sx.pci_bus_id or "unknown"].append(sx)

    node_ev = [n for n in notes if n]
    if excluded:
        node_ev.append(f"{excluded} Xid event(s) on GPUs outside the selection were not judged")
    results = [_node_result(check, groups, sxid_events, unrecognised, node_ev, params,
                            read_summary, window_label, max_lines)]

    def order(k: tuple[str, Any]) -> tuple[int, str]:
        return (0, f"{k[1]:06d}") if k[0] == "gpu" else (1, str(k[1]))

    seen_gpus = set()
    for key in sorted(groups, key=order):
        evs = groups[key]
        info = gpu_map.lookup(evs[0].pci_bus_id)
        results.append(_xid_group_result(check, key, evs, cls, info, limit, max_lines))
        if key[0] == "gpu":
            seen_gpus.add(key[1])
    for g in inventory:
        if g.index is None or g.index in seen_gpus or (sel is not None and g.index not in sel):
            continue
        r = Result(check, Status.PASS, f"GPU {g.index}: no Xid events {window_label}", gpu=g.index)
        r.metric("events", 0, "count")
        r.metric("pci_bus_id", g.pci_bus_id)
        r.metric("uuid", g.uuid)
        results.append(r)
    results[1:] = sorted(results[1:], key=lambda r: (r.gpu is None, r.gpu or 0, r.subject or ""))
    for bus in sorted(sx_groups):
        results.append(_sxid_group_result(check, bus, sx_groups[bus], limit, max_lines))
    return results


def _group_by_subject(events: list[XidEvent], gpu_map: GpuMap,
                      sel: set[int] | None) -> tuple[dict[tuple[str, Any], list[XidEvent]], int]:
    """The events per subject (a GPU, or a bus no GPU answers to), and how many fell on GPUs
    outside the selection (left out)."""
    groups: dict[tuple[str, Any], list[XidEvent]] = defaultdict(list)
    excluded = 0
    for ev in events:
        key = subject_key(ev, gpu_map)
        if sel is not None and key[0] == "gpu" and key[1] not in sel:
            excluded += 1
            continue
        groups[key].append(ev)
    return groups, excluded


def _node_result(check: str, groups: dict[tuple[str, Any], list[XidEvent]], sxid_events: list[SXidEvent],
                 unrecognised: list[Unrecognised], node_ev: list[str], params: XidParams, read_summary: str,
                 window_label: str, max_lines: int) -> Result:
    """The node result: what was read, the window, what could not be recognised."""
    n_sig = sum(1 for v in groups.values() for e in v if e.xid is None)
    n_x = sum(len(v) for v in groups.values()) - n_sig
    if n_x or n_sig or sxid_events:
        sig = f", {n_sig} fault signature(s) without an Xid number" if n_sig else ""
        head = f"{n_x} Xid event(s){sig}, {len(sxid_events)} SXid event(s) {window_label}"
    else:
        head = f"no Xid or SXid events {window_label}"
    summary = f"{head} (read {read_summary})"
    if unrecognised:
        summary += f"; {len(unrecognised)} Xid-like line(s) match no known form"
        node_ev.extend(f"unrecognised: {u.raw}" for u in unrecognised)
    warn = params.get("unrecognised_warn", True)
    metrics = {"xid_events": n_x, "signature_events": n_sig, "sxid_events": len(sxid_events),
               "unrecognised_lines": len(unrecognised)}
    node = evaluate(check, NODE_RULES, metrics, facts={"read": summary}, units=dict.fromkeys(metrics, "count"),
                    limits={"unrecognised_warn_limit": 0 if warn else None, "unrecognised_pass_limit": None if warn else 0},
                    ok_summary=summary)
    node.evidence = _evidence(node_ev, max_lines)
    return node
