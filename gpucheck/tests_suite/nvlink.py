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

A GPU without NvLink (not supported) gets one skip saying so. A capture (`nvidia-smi nvlink -s`)
that says every link of a GPU is inactive, listing none, fails it like a link down.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from ..sdk import (Action, Context, Key, Level, Need, Result, Rule, Status, apply_unreadable, counter_growth, define,
                   each_gpu, evaluate, format_gaps, previous_interval, snapshot_time, unreadable_fields)

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import JudgedGpu, NvLink, NvLinkLink

ID = "nvlink"


class NvlinkParams(TypedDict):
    """nvlink's parameters (DEFAULTS, merged with the config's [checks.nvlink]): the rules' limits."""

    replay_growth_fail: int
    recovery_growth_fail: int
    crc_rate_warn_per_s: float
    crc_rate_fail_per_s: float
    replay_abs_warn: int
    recovery_abs_warn: int
    crc_abs_warn: int


# One link as the check records it (the `links` metric): "state" -> its state, "replay" /
# "recovery" / "crc" (COUNTERS) -> its error counters; None: not read.
LinkCounts = dict[str, int | str | None]
# One link against the previous reading: COUNTERS -> growth, "crc_rate" -> CRC errors per second.
LinkDelta = dict[str, int | float | None]
# A GPU's metrics: counts, rates, the snapshot time, its uuid, and `links` (str(link) -> LinkCounts).
Metric = int | float | str | None | dict[str, LinkCounts]

DEFAULTS: NvlinkParams = {
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
UP_STATES = ("active", "sleep")
# A capture (nvidia-smi nvlink -s) that says every link of a GPU is inactive and lists none.
ALL_INACTIVE_RULE = Rule("all_links_inactive", "==", True, Status.FAIL, Action.REBOOT,
                         "every NvLink inactive (nvidia-smi: unable to retrieve NVLink information as all links are "
                         "inactive)")  # sleep: a trained link in its low-power state
COUNTERS = ("replay", "recovery", "crc")  # keys of a link in the `links` metric

UNITS = {
    "links_total": "count", "links_active": "count", "links_down": "count", "links_unknown": "count",
    "replay_errors": "count", "recovery_errors": "count", "crc_errors": "count",
    "window_s": "s", "replay_growth": "count", "recovery_growth": "count", "crc_growth": "count",
    "replay_growth_max_link": "count", "recovery_growth_max_link": "count", "crc_rate_per_s_max_link": "1/s",
    "replay_errors_max_link": "count", "recovery_errors_max_link": "count", "crc_errors_max_link": "count",
    "snapshot_time": "s",
}


def _crc(link: "NvLinkLink") -> int | None:
    a, b = link.get("crc_flit_errors"), link.get("crc_data_errors")
    if a is None and b is None:
        return None
    return (a or 0) + (b or 0)


# -- history --------------------------------------------------------------------------------------
# A GPU's previous reading: its links, and (metrics holding its snapshot_time, the verdict's time)
# as the history holds them (gpucheck.sdk.previous_interval).
Reading = tuple[dict[int, LinkCounts], tuple[dict[str, Any], Any]]


def read_history(ctx: Context) -> dict[str, Reading]:
    """For every GPU UUID: its links' counters in the latest previous result of this check that
    has them ({link: {"state", "replay", "recovery", "crc"}}), and (metrics holding the reading's
    snapshot_time, verdict time) for `previous_interval`. One pass over the history."""
    if ctx.state is None:
        return {}
    found: dict[str, Reading] = {}
    try:
        for doc in ctx.state.iter_history():
            in_doc: dict[str, tuple[dict[int, LinkCounts], Any]] = {}
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
                elif isinstance(link := m.get("link"), int) and m.get("link_key"):  # one result per link (before)
                    entry = in_doc.setdefault(uuid, ({}, m.get("snapshot_time")))
                    entry[0][link] = {"state": m.get("state"), "replay": m.get("replay_errors"),
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
# Each rule is on a per-GPU aggregate (links down, the largest per-link value), so that it is
# violated exactly when some link breaks it; its cause names those links (facts "<finding>_links"
# and "<finding>_values"). Growth and rate rules apply when a previous reading gives a delta, the
# absolute ones to links with no previous reading.
DOWN_RULES = (Rule("links_down", ">", 0, Status.FAIL, Action.REBOOT, "{down_links} down ({down_values})", "count",
                   "down"),)
DELTA_RULES = (
    Rule("replay_growth_max_link", ">", Key("replay_growth_fail"), Status.FAIL, Action.INVESTIGATE,
         "{replay_growth_links} replay errors {replay_growth_values} since {since}", "count", "replay_growth"),
    Rule("recovery_growth_max_link", ">", Key("recovery_growth_fail"), Status.FAIL, Action.INVESTIGATE,
         "{recovery_growth_links} recovery errors {recovery_growth_values} since {since}", "count", "recovery_growth"),
    Rule("crc_rate_per_s_max_link", ">", Key("crc_rate_fail_per_s"), Status.FAIL, Action.INVESTIGATE,
         "{crc_fail_links} CRC errors {crc_fail_values} since {since} (> {limit:g}/s)", "1/s", "crc_fail"),
    Rule("crc_rate_per_s_max_link", ">", Key("crc_rate_warn_per_s"), Status.WARN, Action.INVESTIGATE,
         "{crc_warn_links} CRC errors {crc_warn_values} since {since} (> {limit:g}/s)", "1/s", "crc_warn"),
)
ABSOLUTE_RULES = tuple(
    Rule(f"{c}_errors_max_link", ">", Key(f"{c}_abs_warn"), Status.WARN, Action.INVESTIGATE,
         f"{{{c}_abs_links}} {what} errors {{{c}_abs_values}} since driver load (no previous reading)", "count",
         f"{c}_abs")
    for c, what in (("replay", "replay"), ("recovery", "recovery"), ("crc", "CRC"))
)
# How a finding's per-link values are written in its cause.
_VALUE_TEXT = {"replay_growth": "+{}", "recovery_growth": "+{}", "crc_fail": "{:g}/s", "crc_warn": "{:g}/s"}


@dataclass
class _Links:
    """One GPU's links as read now and compared with the previous reading."""

    numbers: list[Any]  # the links, in order
    compact: dict[str, LinkCounts]  # str(link) -> {"state", "replay", "recovery", "crc"} now
    delta: dict[int, LinkDelta]  # links compared with a previous reading: growth, crc_rate
    absolute: list[int]  # links with no previous reading: judged on counts since driver load
    notes: list[str]

    def values(self, finding: str) -> dict[Any, Any]:
        """Each link's value for a finding's rule."""
        if finding == "down":
            return {n: self.compact[str(n)]["state"] for n in self.numbers}
        if finding.endswith("_abs"):
            return {n: self.compact[str(n)][finding[:-4]] for n in self.absolute}
        key = "crc_rate" if finding.startswith("crc") else finding[:-7]
        return {n: d[key] for n, d in self.delta.items()}


def _read_links(links: "list[NvLinkLink]", prev_links: dict[int, LinkCounts], interval: float | None) -> _Links:
    out = _Links([], {}, {}, [], [])
    for lk in links:
        n = lk.get("link")
        out.numbers.append(n)
        cur: LinkCounts = {"state": lk.get("state"), "replay": lk.get("replay_errors"),
                           "recovery": lk.get("recovery_errors"), "crc": _crc(lk)}
        out.compact[str(n)] = cur
        pl = prev_links.get(n)
        if interval is not None and pl is not None:
            d: LinkDelta = {}
            for c in COUNTERS:
                d[c], why = counter_growth(cur[c], pl.get(c))
                if why:
                    out.notes.append(f"NvLink {n} {c} errors: {why}")
            crc = d["crc"]
            d["crc_rate"] = None if crc is None else round(crc / max(interval, 1.0), 3)
            out.delta[n] = d
        else:
            out.absolute.append(n)
            if interval is not None:
                out.notes.append(f"NvLink {n}: not in the previous reading; counters since driver load")
    return out


def _metrics(g: "JudgedGpu", lk: _Links, interval: float | None, now: float | None) -> dict[str, Metric]:
    states = [c["state"] for c in lk.compact.values()]
    d = lk.delta.values()
    metrics: dict[str, Metric] = {
        "uuid": g.get("uuid"),
        "snapshot_time": now,
        "links_total": len(states),
        "links_active": sum(1 for s in states if s in UP_STATES),
        "links_down": sum(1 for s in states if s is not None and s not in UP_STATES),
        "links_unknown": sum(1 for s in states if s is None),
        "replay_errors": _total([c["replay"] for c in lk.compact.values()]),
        "recovery_errors": _total([c["recovery"] for c in lk.compact.values()]),
        "crc_errors": _total([c["crc"] for c in lk.compact.values()]),
        "window_s": round(interval, 1) if lk.delta and interval is not None else None,
        "replay_growth": _total([x["replay"] for x in d]),
        "recovery_growth": _total([x["recovery"] for x in d]),
        "crc_growth": _total([x["crc"] for x in d]),
        "replay_growth_max_link": _max([x["replay"] for x in d]),
        "recovery_growth_max_link": _max([x["recovery"] for x in d]),
        "crc_rate_per_s_max_link": _max([x["crc_rate"] for x in d]),
    }
    if lk.absolute:
        for c in COUNTERS:
            metrics[f"{c}_errors_max_link"] = _max([lk.compact[str(n)][c] for n in lk.absolute])
    metrics["links"] = lk.compact
    return metrics


def _findings(rules: tuple[Rule, ...], p: NvlinkParams, lk: _Links) -> dict[str, list[int]]:
    """Per finding, the links that break its rule on their own (a link over the CRC fail rate is
    not also in the warn band)."""
    found: dict[str, list[int]] = {}
    for rule in rules:
        t = rule.resolve(p)
        vals = lk.values(rule.finding)
        if rule.finding == "down":
            found["down"] = [n for n, s in vals.items() if s is not None and s not in UP_STATES]
        elif t is not None:
            found[rule.finding] = [n for n, v in vals.items() if t.violated_by(v)]
    found["crc_warn"] = [n for n in found.get("crc_warn", []) if n not in found.get("crc_fail", [])]
    return found


def _facts(found: dict[str, list[int]], lk: _Links, since: str | None) -> dict[str, str | None]:
    facts: dict[str, str | None] = {"since": since}
    for finding, ns in found.items():
        vals = lk.values(finding)
        facts[f"{finding}_links"] = _names(ns) if ns else None  # None: the cause names nothing
        if finding == "down":
            facts["down_values"] = ", ".join(sorted({str(vals[n]) for n in ns}))
        else:
            facts[f"{finding}_values"] = ", ".join(_VALUE_TEXT.get(finding, "{}").format(vals[n]) for n in ns)
    return facts


def _judge_links(g: "JudgedGpu", links: "list[NvLinkLink]", p: NvlinkParams, prev: Reading | None,
                 now: float | None) -> Result:
    idx = g.get("index")
    interval, why_not = previous_interval(prev[1] if prev else None, now)
    prev_links = prev[0] if prev is not None and interval is not None else {}
    since = f"{_iso(now - interval)} ({interval:.0f} s)" if interval is not None and now is not None else None
    lk = _read_links(links, prev_links, interval)
    if lk.absolute and interval is None:
        lk.notes.insert(0, f"counters since driver load, no delta available ({why_not})")
    rules = DOWN_RULES + (DELTA_RULES if lk.delta else ()) + (ABSOLUTE_RULES if lk.absolute else ())
    metrics = _metrics(g, lk, interval, now)
    found = _findings(rules, p, lk)
    r = evaluate(ID, rules, metrics, limits=p, facts=_facts(found, lk, since), prefix=f"GPU {idx}: ", gpu=idx,
                 units={k: u for k, u in UNITS.items() if k in metrics},
                 ok_summary=_ok_summary(idx, metrics, lk, since))
    for n in sorted({n for ns in found.values() for n in ns}):
        r.evidence.append(_link_evidence(n, lk, since))
    r.evidence.extend(lk.notes)
    return r


def _ok_summary(idx: Any, metrics: dict[str, Metric], lk: _Links, since: str | None) -> str:
    states = [c["state"] for c in lk.compact.values()]
    total, up = len(states), sum(1 for s in states if s in UP_STATES)  # metrics links_total, links_active
    asleep = sum(1 for c in lk.compact.values() if c["state"] == "sleep")
    if up == total:
        head = (f"{total}/{total} NvLinks up ({total - asleep} active, {asleep} in sleep)" if asleep
                else f"{total}/{total} NvLinks active")
    else:
        unsupported = sorted(int(k) for k, c in lk.compact.items() if c["state"] is None)
        head = f"{up}/{total} NvLinks active; state of {_names(unsupported)} not supported"
    if lk.delta:
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
    if lk.delta and lk.absolute:
        tail += f"; {_names(lk.absolute)} not in the previous reading"
    no_delta = sorted({n for n, d in lk.delta.items() if any(d[c] is None for c in COUNTERS)})
    if no_delta:
        tail += f"; no delta for {_names(no_delta)} (see evidence)"
    return f"GPU {idx}: {head}; {tail}"


def _link_evidence(n: int, lk: _Links, since: str | None) -> str:
    c = lk.compact[str(n)]
    if n in lk.delta:
        d = lk.delta[n]
        grow = {k: ("" if d[k] is None else f" (+{d[k]})") for k in ("replay", "recovery")}
        crc = "" if d["crc"] is None else f" (+{d['crc']}, {d['crc_rate']:g}/s)"
        return (f"NvLink {n}: {c['state']}, replay {c['replay']}{grow['replay']}, "
                f"recovery {c['recovery']}{grow['recovery']}, CRC {c['crc']}{crc} since {since}")
    return (f"NvLink {n}: {c['state']}, replay {c['replay']}, recovery {c['recovery']}, "
            f"CRC {c['crc']} since driver load")


def _gpu(g: "JudgedGpu", p: NvlinkParams, history: dict[str, Reading], now: float | None) -> Result:
    idx = g.get("index")
    nv: NvLink | dict[str, None] = g.get("nvlink") or {}
    supported = nv.get("supported")
    links = sorted(nv.get("links") or [], key=lambda x: x.get("link", 0))
    if nv.get("all_inactive") and not links:  # nvidia-smi nvlink -s: "... as all links are inactive"
        r = evaluate(ID, [ALL_INACTIVE_RULE], {"uuid": g.get("uuid"), "all_links_inactive": True}, gpu=idx,
                     prefix=f"GPU {idx}: ", ok_summary=f"GPU {idx}: NvLinks active")
        return apply_unreadable(r, g, READS)
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


def _link_errors(g: "JudgedGpu") -> bool:
    """Whether the links could not be read, or the capture's format does not carry them."""
    return any(k.startswith("nvlink") for k in (*unreadable_fields(g), *format_gaps(g)))


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
    return each_gpu(ID, ctx, DEFAULTS, _gpu, lambda c: (read_history(c), snapshot_time(c)))


CHECKS = [nvlink]
