"""nvlink: every NvLink of every GPU up, and its error counters not growing.

One result per GPU (subject "gpu<i>"), whose status is the worst over that GPU's links; the
summary names the links that are not healthy and why, the evidence has one line per such link
with its counters. Rules, applied to every link on its own:
- a link that is not up (active, or sleep: a trained link in its low-power state) is down: fail,
  reboot (a link that trained down rarely comes back without a reset of the GPUs and NVSwitches);
- error counters (NVML DL counters: replay, recovery, CRC flit + CRC data) are compared with the
  same link's reading in the latest previous result of this check for the same GPU UUID (the
  per-link metric `links` of that result):
  - replay or recovery errors grew by more than `replay_growth_fail` / `recovery_growth_fail`:
    fail (DCGM fails NvLink replay/recovery errors from 1 on);
  - CRC errors per second above `crc_rate_fail_per_s` (100/s: "RM has informed us that CRC errors
    only matter at rates of 100+ per second", DCGM) fail, above `crc_rate_warn_per_s` warn;
- a link with no previous reading has its counters since driver load judged against absolute
  limits (warn only: nothing says when those errors happened). A counter that went back (driver
  reload or GPU reset since the previous reading) gives no delta and is only noted.

The result's thresholds are one per rule, each on the per-GPU aggregate it is compared with: the
number of links down (`links_down`) and the largest per-link value (`*_max_link`), so that a
threshold is violated exactly when some link breaks that rule. The history is read once per run
of the check. Results of gpucheck versions that wrote one result per link ("gpu<i>/nvlink<n>",
metric `link_key`) are still read as previous readings.

A GPU without NvLink (not supported) gets one skip saying so.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from ..check import Context, Level, Need, define
from ..result import Action, Result, Status, Threshold, strongest_action, worst_status
from . import (
    apply_unreadable,
    counter_growth,
    gpu_state_result,
    previous_interval,
    selected_gpus_or_skip,
    snapshot_time,
    unreadable_fields,
)

ID = "nvlink"

DEFAULTS = {
    "replay_growth_fail": 0,  # fail when a link's replay errors grew by more than this since the previous run
    "recovery_growth_fail": 0,  # fail when a link's recovery errors grew by more than this
    "crc_rate_warn_per_s": 1.0,  # warn when a link's CRC (flit + data) errors per second exceed this
    "crc_rate_fail_per_s": 100.0,  # fail above this (DCGM/RM)
    "replay_abs_warn": 0,  # no history: warn when a link's replay errors since driver load exceed this
    "recovery_abs_warn": 0,  # no history: warn when a link's recovery errors since driver load exceed this
    "crc_abs_warn": 1000,  # no history: warn when a link's CRC errors since driver load exceed this
}

# The snapshot fields a GPU's result depends on: every link's state and error counters feed fail
# rules (error when one could not be read or is invalid); the link count only sizes the read (the
# reader probes the links without it) and the UUID keys the history (warn).
READS = {"nvlink": Status.ERROR, "nvlink.link_count": Status.WARN, "uuid": Status.WARN}
UP_STATES = ("active", "sleep")  # sleep: a trained link in its low-power state
COUNTERS = ("replay", "recovery", "crc")  # keys of a link in the `links` metric

UNITS = {
    "links_total": "count", "links_active": "count", "links_down": "count", "links_unknown": "count",
    "replay_errors": "count", "recovery_errors": "count", "crc_errors": "count",
    "window_s": "s", "replay_growth": "count", "recovery_growth": "count", "crc_growth": "count",
    "replay_growth_max_link": "count", "recovery_growth_max_link": "count", "crc_rate_per_s_max_link": "1/s",
    "replay_errors_max_link": "count", "recovery_errors_max_link": "count", "crc_errors_max_link": "count",
    "snapshot_time": "s",
}


def _crc(link: dict[str, Any]) -> int | None:
    a, b = link.get("crc_flit_errors"), link.get("crc_data_errors")
    if a is None and b is None:
        return None
    return (a or 0) + (b or 0)


# -- history --------------------------------------------------------------------------------------
Reading = tuple[dict[int, dict[str, Any]], tuple[dict[str, Any], Any]]


def read_history(ctx: Context) -> dict[str, Reading]:
    """For every GPU UUID: its links' counters in the latest previous result of this check that
    has them ({link: {"state", "replay", "recovery", "crc"}}), and (metrics holding the reading's
    snapshot_time, verdict time) for `previous_interval`. One pass over the history."""
    if ctx.state is None:
        return {}
    found: dict[str, Reading] = {}
    try:
        for doc in ctx.state.iter_history():
            in_doc: dict[str, tuple[dict[int, dict[str, Any]], Any]] = {}
            for r in doc.get("results", []):
                if not isinstance(r, dict) or r.get("check") != ID or not isinstance(r.get("metrics"), dict):
                    continue
                m = {k: (v.get("value") if isinstance(v, dict) else None) for k, v in r["metrics"].items()}
                uuid = m.get("uuid")
                if not isinstance(uuid, str):
                    continue
                links = m.get("links")
                if isinstance(links, dict):  # one result per GPU
                    entry = in_doc.setdefault(uuid, ({}, m.get("snapshot_time")))
                    for k, v in links.items():
                        if isinstance(v, dict) and str(k).isdigit():
                            entry[0][int(k)] = {c: v.get(c) for c in ("state",) + COUNTERS}
                elif isinstance(m.get("link"), int) and m.get("link_key"):  # one result per link (before)
                    entry = in_doc.setdefault(uuid, ({}, m.get("snapshot_time")))
                    entry[0][m["link"]] = {"state": m.get("state"), "replay": m.get("replay_errors"),
                                           "recovery": m.get("recovery_errors"), "crc": m.get("crc_errors")}
            for uuid, (links, then) in in_doc.items():
                if links:
                    found[uuid] = (links, ({"snapshot_time": then}, doc.get("time")))
    except OSError:
        return found
    return found


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _total(values: list[Any]) -> int | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def _max(values: list[Any]) -> Any:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _names(ns: list[int]) -> str:
    return "NvLink " + ", ".join(str(n) for n in ns)


# -- one GPU --------------------------------------------------------------------------------------
def _judge_links(g: dict[str, Any], links: list[dict[str, Any]], p: dict[str, Any], prev: Reading | None,
                 now: float | None) -> Result:
    idx = g.get("index")
    interval, why_not = previous_interval(prev[1] if prev else None, now)
    prev_links = prev[0] if prev is not None and interval is not None else {}
    since = f"{_iso(now - interval)} ({interval:.0f} s)" if interval is not None and now is not None else None

    t_down = Threshold("links_down", ">", 0, Status.FAIL, "count")
    t_replay = Threshold("replay_growth_max_link", ">", p["replay_growth_fail"], Status.FAIL, "count")
    t_recovery = Threshold("recovery_growth_max_link", ">", p["recovery_growth_fail"], Status.FAIL, "count")
    t_crc_fail = Threshold("crc_rate_per_s_max_link", ">", p["crc_rate_fail_per_s"], Status.FAIL, "1/s")
    t_crc_warn = Threshold("crc_rate_per_s_max_link", ">", p["crc_rate_warn_per_s"], Status.WARN, "1/s")
    t_abs = {
        "replay": Threshold("replay_errors_max_link", ">", p["replay_abs_warn"], Status.WARN, "count"),
        "recovery": Threshold("recovery_errors_max_link", ">", p["recovery_abs_warn"], Status.WARN, "count"),
        "crc": Threshold("crc_errors_max_link", ">", p["crc_abs_warn"], Status.WARN, "count"),
    }

    compact: dict[str, dict[str, Any]] = {}
    delta: dict[int, dict[str, Any]] = {}  # links compared with a previous reading
    absolute: list[int] = []  # links with no previous reading: judged on counts since driver load
    # findings: rule -> [(link, value)], in the order they are reported within a status
    rules = ("down", "replay_growth", "recovery_growth", "crc_fail", "crc_warn",
             "replay_abs", "recovery_abs", "crc_abs")
    found: dict[str, list[tuple[int, Any]]] = {r: [] for r in rules}
    bad_links: set[int] = set()
    notes: list[str] = []
    for lk in links:
        n = lk.get("link")
        state = lk.get("state")
        cur = {"state": state, "replay": lk.get("replay_errors"), "recovery": lk.get("recovery_errors"),
               "crc": _crc(lk)}
        compact[str(n)] = cur
        if state is not None and state not in UP_STATES:
            found["down"].append((n, state))
            bad_links.add(n)
        pl = prev_links.get(n)
        if interval is not None and pl is not None:
            d: dict[str, Any] = {}
            for c in COUNTERS:
                d[c], why = counter_growth(cur[c], pl.get(c))
                if why:
                    notes.append(f"NvLink {n} {c} errors: {why}")
            d["crc_rate"] = None if d["crc"] is None else round(d["crc"] / max(interval, 1.0), 3)
            delta[n] = d
            for rule, t, v in (("replay_growth", t_replay, d["replay"]), ("recovery_growth", t_recovery, d["recovery"])):
                if t.violated_by(v):
                    found[rule].append((n, v))
                    bad_links.add(n)
            if t_crc_fail.violated_by(d["crc_rate"]):
                found["crc_fail"].append((n, d["crc_rate"]))
                bad_links.add(n)
            elif t_crc_warn.violated_by(d["crc_rate"]):
                found["crc_warn"].append((n, d["crc_rate"]))
                bad_links.add(n)
        else:
            absolute.append(n)
            if interval is not None:
                notes.append(f"NvLink {n}: not in the previous reading; counters since driver load")
            for c in COUNTERS:
                if t_abs[c].violated_by(cur[c]):
                    found[f"{c}_abs"].append((n, cur[c]))
                    bad_links.add(n)
    if absolute and interval is None:
        notes.insert(0, f"counters since driver load, no delta available ({why_not})")

    total = len(links)
    up = sum(1 for c in compact.values() if c["state"] in UP_STATES)
    unknown = sum(1 for c in compact.values() if c["state"] is None)
    metrics: dict[str, Any] = {
        "uuid": g.get("uuid"),
        "snapshot_time": now,
        "links_total": total,
        "links_active": up,
        "links_down": len(found["down"]),
        "links_unknown": unknown,
        "replay_errors": _total([c["replay"] for c in compact.values()]),
        "recovery_errors": _total([c["recovery"] for c in compact.values()]),
        "crc_errors": _total([c["crc"] for c in compact.values()]),
        "window_s": round(interval, 1) if delta else None,
        "replay_growth": _total([d["replay"] for d in delta.values()]),
        "recovery_growth": _total([d["recovery"] for d in delta.values()]),
        "crc_growth": _total([d["crc"] for d in delta.values()]),
        "replay_growth_max_link": _max([d["replay"] for d in delta.values()]),
        "recovery_growth_max_link": _max([d["recovery"] for d in delta.values()]),
        "crc_rate_per_s_max_link": _max([d["crc_rate"] for d in delta.values()]),
    }
    thresholds = [t_down]
    if delta:
        thresholds += [t_replay, t_recovery, t_crc_fail, t_crc_warn]
    if absolute:
        for c in COUNTERS:
            metrics[f"{c}_errors_max_link"] = _max([compact[str(n)][c] for n in absolute])
        thresholds += list(t_abs.values())
    metrics["links"] = compact

    status_of = {"down": Status.FAIL, "replay_growth": Status.FAIL, "recovery_growth": Status.FAIL,
                 "crc_fail": Status.FAIL, "crc_warn": Status.WARN,
                 "replay_abs": Status.WARN, "recovery_abs": Status.WARN, "crc_abs": Status.WARN}
    action_of = {"down": Action.REBOOT}
    hit = [r for r in rules if found[r]]
    status = worst_status(status_of[r] for r in hit) if hit else Status.PASS
    if hit:
        parts = []
        for rule in sorted(hit, key=lambda r: status_of[r] != Status.FAIL):  # fails first
            ns = [n for n, _ in found[rule]]
            vals = [v for _, v in found[rule]]
            if rule == "down":
                parts.append(f"{_names(ns)} down ({', '.join(sorted(set(vals)))})")
            elif rule in ("replay_growth", "recovery_growth"):
                what = rule.split("_")[0]
                parts.append(f"{_names(ns)} {what} errors {', '.join(f'+{v}' for v in vals)} since {since}")
            elif rule in ("crc_fail", "crc_warn"):
                t = t_crc_fail if rule == "crc_fail" else t_crc_warn
                parts.append(f"{_names(ns)} CRC errors {', '.join(f'{v:g}/s' for v in vals)} since {since} "
                             f"(> {t.limit:g}/s)")
            else:
                what = rule.split("_")[0].replace("crc", "CRC")
                parts.append(f"{_names(ns)} {what} errors {', '.join(str(v) for v in vals)} since driver load "
                             "(no previous reading)")
        summary = f"GPU {idx}: " + "; ".join(parts)
        action = strongest_action(action_of.get(r, Action.INVESTIGATE) for r in hit if status_of[r] == status)
    else:
        action = Action.NONE
        asleep = sum(1 for c in compact.values() if c["state"] == "sleep")
        if up == total:
            head = (f"{total}/{total} NvLinks up ({total - asleep} active, {asleep} in sleep)" if asleep
                    else f"{total}/{total} NvLinks active")
        else:
            unsupported = sorted(int(k) for k, c in compact.items() if c["state"] is None)
            head = f"{up}/{total} NvLinks active; state of {_names(unsupported)} not supported"
        if delta:
            grew = [f"{c} errors +{metrics[c + '_growth']} (at most +{metrics[c + '_growth_max_link']} on a link)"
                    for c in ("replay", "recovery") if metrics[c + "_growth"]]
            crc = (f"CRC errors +{metrics['crc_growth']} (at most {metrics['crc_rate_per_s_max_link']:g}/s on a link)"
                   if metrics["crc_growth"] else None)
            if grew:
                tail = "; ".join(grew + ([crc] if crc else [])) + f" since {since}, within the limits"
            else:
                tail = f"no replay/recovery errors since {since}" + (f"; {crc}" if crc else "")
        else:
            tail = (f"counters since driver load, no previous reading: replay {metrics['replay_errors']}, "
                    f"recovery {metrics['recovery_errors']}, CRC {metrics['crc_errors']}")
        if delta and absolute:
            tail += f"; {_names(absolute)} not in the previous reading"
        no_delta = sorted({n for n, d in delta.items() if any(d[c] is None for c in COUNTERS)})
        if no_delta:
            tail += f"; no delta for {_names(no_delta)} (see evidence)"
        summary = f"GPU {idx}: {head}; {tail}"

    r = Result(ID, status, summary, gpu=idx, action=action, metrics=metrics,
               units={k: u for k, u in UNITS.items() if k in metrics}, thresholds=thresholds)
    for n in sorted(bad_links):
        c = compact[str(n)]
        if n in delta:
            d = delta[n]
            grow = {k: ("" if d[k] is None else f" (+{d[k]})") for k in ("replay", "recovery")}
            crc = "" if d["crc"] is None else f" (+{d['crc']}, {d['crc_rate']:g}/s)"
            r.evidence.append(f"NvLink {n}: {c['state']}, replay {c['replay']}{grow['replay']}, "
                              f"recovery {c['recovery']}{grow['recovery']}, CRC {c['crc']}{crc} since {since}")
        else:
            r.evidence.append(f"NvLink {n}: {c['state']}, replay {c['replay']}, recovery {c['recovery']}, "
                              f"CRC {c['crc']} since driver load")
    r.evidence.extend(notes)
    return r


def _gpu(g: dict[str, Any], p: dict[str, Any], history: dict[str, Reading], now: float | None) -> Result:
    bad = gpu_state_result(ID, g)
    if bad is not None:
        return bad
    idx = g.get("index")
    nv = g.get("nvlink") or {}
    supported = nv.get("supported")
    links = sorted(nv.get("links") or [], key=lambda x: x.get("link", 0))
    if supported is False or (supported is None and not links and not _link_errors(g)):
        r = Result(ID, Status.SKIP, f"GPU {idx}: no NvLink on this GPU (not supported)", gpu=idx)
        r.metric("uuid", g.get("uuid"))
        return r
    if not links:
        r = Result(ID, Status.SKIP, f"GPU {idx}: NvLink state could not be read", gpu=idx)
        r.metric("uuid", g.get("uuid"))
        return apply_unreadable(r, g, READS)
    uuid = g.get("uuid")
    r = _judge_links(g, links, p, history.get(uuid) if uuid else None, now)
    if r.metrics["links_unknown"] == len(links) and r.status == Status.PASS:
        r.status = Status.SKIP
        r.summary = f"GPU {idx}: the state of its {len(links)} NvLinks is not supported"
    # A link whose state or counters could not be read (listed or not) leaves the GPU unjudged
    # unless another link already fails it.
    return apply_unreadable(r, g, READS)


def _link_errors(g: dict[str, Any]) -> bool:
    return any(k.startswith("nvlink") for k in unreadable_fields(g))


@define(
    ID,
    title="NvLink links up; replay, recovery and CRC error growth",
    level=Level.QUICK,
    needs=(Need.NVML,),
    budget_s=8.0,
    detects="NvLink links down, flapping links (replay/recovery growth), CRC error storms (Xid 74 precursors)",
    defaults=DEFAULTS,
)
def nvlink(ctx: Context) -> list[Result]:
    gpus, skip = selected_gpus_or_skip(ID, ctx)
    if skip:
        return skip
    p = ctx.params(ID, DEFAULTS)
    history = read_history(ctx)
    now = snapshot_time(ctx)
    return [_gpu(g, p, history, now) for g in gpus]


CHECKS = [nvlink]
