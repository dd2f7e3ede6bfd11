"""Judging power and clock stability from sampled telemetry: pure functions, no NVML, no torch.

The eud.power check (gpucheck.tests_suite.eud_power) loads every GPU with a sustained GEMM while the parent
samples NVML (gpucheck.workers.sampler). This module turns those samples into one Result per GPU.
Every threshold comes from the check's parameters (`DEFAULTS` in gpucheck.tests_suite.eud_power) and is shown
in the result next to the measured value.

Per GPU, over the *load window* (from the worker's first GEMM window plus `warmup_s`, to its last
report; the warm-up is excluded because clocks, power and temperature are still ramping):

- fail "clock cut by hardware": the SM clock was cut for a hardware reason (NVML clock-event
  reasons hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown) in at least
  max(hw_min_samples, ceil(hw_fail_share x load samples)) samples; fewer such samples (one
  glitch) is a warn, never a silent pass;
- fail "cannot reach its power limit": the mean of the top `power_top_fraction` of the power
  samples is below `power_fail_fraction` of the enforced power limit (sw_power_cap reached is the
  normal state of a GPU under a dense GEMM and is no fault);
- warn "hotter than its peers": the median load temperature is more than `temp_peer_warn_c` above
  the median of the other GPUs' medians;
- fail "silent data corruption" when the load itself (burn's verified GEMM) saw a wrong result;
- warn on Xid events delivered during the load.

Clock drops for software reasons (sw_power_cap, sw_thermal_slowdown) are evidence, not a fault.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Iterable, TypedDict

from ..core.result import Action, Key, Result, Rule, Status, evaluate
from ..workers.per_gpu import LevelDurations, PoolParams

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import Sample

CHECK_ID = "eud.power"


class PowerParams(PoolParams, LevelDurations):
    """eud.power's parameters (gpucheck.tests_suite.eud_power.DEFAULTS, merged with the config)."""

    warmup_s: float
    dtype: str
    size: int
    cpu_size: int
    repeats: int
    window_s: float
    ref_every_s: float
    min_load_samples: int
    hw_fail_share: float
    hw_min_samples: int
    power_top_fraction: float
    power_top_min_samples: int
    power_fail_fraction: float
    temp_peer_warn_c: float


class _LoadExtras(TypedDict, total=False):
    limit_w: float | None  # the enforced power limit, W
    limit_source: str
    injected: list[str]  # injection texts
    evidence: list[str]
    load: str  # what the load was
    sdc_events: int  # wrong GEMM results the load saw
    sdc_detail: str
    xid: list[int] | None  # Xid codes delivered during the load; None: not watched


class PowerLoad(_LoadExtras):
    """One GPU's load, as judge_power judges it."""

    samples: "list[Sample]"  # the load window's samples


class PowerStats(TypedDict):
    """The numbers of one GPU's load window (gpu_stats); None where never read."""

    load_samples: int
    power_samples: int
    clock_samples: int
    reason_samples: int
    power_top_mean_w: float | None
    power_mean_w: float | None
    power_limit_w: float | None
    power_fraction_of_limit: float | None
    sm_clock_median_mhz: float | None
    sm_clock_min_mhz: float | None
    sm_clock_max_mhz: float | None
    sm_clock_hw_median_mhz: float | None
    sm_clock_other_median_mhz: float | None
    temperature_median_c: float | None
    temperature_max_c: float | None
    hw_slowdown_samples: int
    hw_slowdown_share: float | None
    reason_counts: dict[str, int]
    hw_reasons_seen: list[str]
    sw_reasons_seen: list[str]

# NVML clock-event reasons that mean hardware cut the clocks (names as in gpucheck.platform.telemetry.throttle).
HW_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
# Reasons that are the normal state of a loaded GPU or a software policy: evidence only.
SW_REASONS = ("sw_power_cap", "sw_thermal_slowdown")


def load_window(samples: "Iterable[Sample]", start: float | None, end: float | None) -> "list[Sample]":
    """Samples whose `time` lies in [start, end] (either bound None: open). Samples with an
    `error` and no reading are dropped."""
    out = []
    for s in samples:
        t = s.get("time")
        if not isinstance(t, (int, float)):
            continue
        if start is not None and t < start:
            continue
        if end is not None and t > end:
            continue
        if s.get("error") and s.get("sm_clock_mhz") is None and s.get("power_w") is None:
            continue
        out.append(s)
    return out


def _num(samples: "list[Sample]", key: str) -> list[float]:
    values = (s.get(key) for s in samples)
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _names(s: "Sample") -> list[str]:
    return list(s.get("throttle_reason_names") or [])


def hw_fail_bar(n_load: int, p: PowerParams) -> int:
    """How many hardware-slowdown samples fail a GPU: a meaningful share of the load, never one
    glitch."""
    return max(int(p["hw_min_samples"]), math.ceil(float(p["hw_fail_share"]) * n_load))


def gpu_stats(samples: "list[Sample]", limit_w: float | None, p: PowerParams) -> PowerStats:
    """Numbers of one GPU's load window. Values are None when never read."""
    n = len(samples)
    power = _num(samples, "power_w")
    clocks = _num(samples, "sm_clock_mhz")
    temps = _num(samples, "temperature_c")
    reason_counts: dict[str, int] = {}
    hw_samples: list[Sample] = []
    other_samples: list[Sample] = []
    masks_read = 0
    for s in samples:
        names = _names(s)
        if s.get("throttle_reason_names") is not None or s.get("throttle_reasons") is not None:
            masks_read += 1
        for name in names:
            reason_counts[name] = reason_counts.get(name, 0) + 1
        (hw_samples if any(r in names for r in HW_REASONS) else other_samples).append(s)
    top_mean = None
    if power:
        k = max(int(p["power_top_min_samples"]), math.ceil(float(p["power_top_fraction"]) * len(power)))
        top = sorted(power, reverse=True)[:k]
        top_mean = statistics.fmean(top)
    hw_clocks = _num(hw_samples, "sm_clock_mhz")
    other_clocks = _num(other_samples, "sm_clock_mhz")
    return {
        "load_samples": n,
        "power_samples": len(power),
        "clock_samples": len(clocks),
        "reason_samples": masks_read,
        "power_top_mean_w": None if top_mean is None else round(top_mean, 1),
        "power_mean_w": round(statistics.fmean(power), 1) if power else None,
        "power_limit_w": limit_w,
        "power_fraction_of_limit": (round(top_mean / limit_w, 3) if top_mean is not None and limit_w else None),
        "sm_clock_median_mhz": statistics.median(clocks) if clocks else None,
        "sm_clock_min_mhz": min(clocks) if clocks else None,
        "sm_clock_max_mhz": max(clocks) if clocks else None,
        "sm_clock_hw_median_mhz": statistics.median(hw_clocks) if hw_clocks else None,
        "sm_clock_other_median_mhz": statistics.median(other_clocks) if other_clocks else None,
        "temperature_median_c": statistics.median(temps) if temps else None,
        "temperature_max_c": max(temps) if temps else None,
        "hw_slowdown_samples": len(hw_samples),
        "hw_slowdown_share": round(len(hw_samples) / n, 3) if n else None,
        "reason_counts": reason_counts,
        "hw_reasons_seen": [r for r in HW_REASONS if reason_counts.get(r)],
        "sw_reasons_seen": [r for r in SW_REASONS if reason_counts.get(r)],
    }


def _fmt_w(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f} W"


def judge_power(loads: dict[int, PowerLoad], p: PowerParams) -> list[Result]:
    """One result per GPU (loads[gpu]: PowerLoad, the load-window samples and what is known of the load)."""
    stats = {g: gpu_stats(d["samples"], d.get("limit_w"), p) for g, d in loads.items()}
    min_n = int(p["min_load_samples"])
    temps = {g: s["temperature_median_c"] for g, s in stats.items()
             if s["temperature_median_c"] is not None and s["load_samples"] >= min_n}
    out: list[Result] = []
    for g in sorted(loads):
        out.append(_judge_one(g, loads[g], stats[g], temps, p))
    return out


_POWER_REACH = ("cannot reach its power limit under load: top {top_fraction} of samples average {power_top_text} of "
                "the {power_limit_text} enforced limit")
# Limits by key (see _limits); a rule whose limit is None does not apply to this GPU (nothing read).
RULES = (
    Rule("sdc_events", ">", 0, Status.FAIL, Action.DRAIN,
         "silent data corruption during the power load: {sdc_detail} ({detail})", "count"),
    Rule("hw_slowdown_samples", ">=", Key("hw_fail_bar"), Status.FAIL, Action.DRAIN,
         "clock cut by hardware under load: {hw_reasons} in {hw_slowdown_samples} of {load_samples} load "
         "samples{hw_clock} ({detail})", "count"),
    Rule("hw_slowdown_samples", ">", Key("hw_warn_limit"), Status.WARN, Action.INVESTIGATE,
         "{hw_reasons} in {hw_slowdown_samples} of {load_samples} load samples, below the fail bar of "
         "{hw_fail_bar}{hw_clock} ({detail})", "count"),
    Rule("power_fraction_of_limit", "<", Key("power_fail_fraction"), Status.FAIL, Action.DRAIN,
         _POWER_REACH + " ({detail})"),
    # Clocks held down by a site setting explain a low draw: that is not a hardware fault.
    Rule("power_fraction_of_limit", "<", Key("power_site_fraction"), Status.WARN, Action.INVESTIGATE,
         _POWER_REACH + "; applications_clocks_setting seen in {site_clocks} samples (clocks set by the site hold "
         "the power down) ({detail})"),
    Rule("temperature_over_peers_c", ">", Key("temp_peer_warn_c"), Status.WARN, Action.INVESTIGATE,
         "hotter than its peers under the same load: median {temperature_median_c:.0f} C vs {peers_c:.0f} C on the "
         "other GPUs (max {temperature_max_c:.0f} C) ({detail})", "C"),
    Rule("xid_events", ">", Key("xid_limit"), Status.WARN, Action.INVESTIGATE,
         "Xid {xids} during the load (see the xid check) ({detail})", "count"),
)


def _judge_one(g: int, d: PowerLoad, s: PowerStats, temps: dict[int, float], p: PowerParams) -> Result:
    inj = list(d.get("injected", []))
    n = s["load_samples"]
    min_n = int(p["min_load_samples"])
    evidence = list(d.get("evidence", []))
    load = d.get("load")
    if load:
        evidence.insert(0, load)
    if n < min_n or (s["power_samples"] == 0 and s["clock_samples"] == 0 and s["reason_samples"] == 0):
        why = (f"{n} telemetry sample(s) under load after the {p['warmup_s']:g} s warm-up, fewer than "
               f"min_load_samples {min_n} (load too short, or NVML telemetry missing)" if n < min_n else
               "NVML returned no power, SM clock or clock-event reading during the load")
        r = Result(CHECK_ID, Status.ERROR, f"could not judge: {why}", gpu=g, injected=inj, evidence=evidence)
        r.metric("load_samples", n, "count")
        return r
    metrics, units, limits, facts, notes = _inputs(g, d, s, temps, p)
    res = evaluate(CHECK_ID, RULES, metrics, limits=limits, facts=facts, units=units, gpu=g,
                   ok_summary=_ok_summary(s, d.get("limit_w"), notes))
    if res.status != Status.PASS and notes:
        res.summary += "; " + "; ".join(notes)
    res.injected = inj
    counts = ", ".join(f"{k} {v}" for k, v in sorted(s["reason_counts"].items())) or "none"
    evidence.append(f"{n} load samples ({s['power_samples']} with power, {s['clock_samples']} with SM clock, "
                    f"{s['reason_samples']} with clock-event reasons); reasons seen (samples): {counts}")
    if s["sm_clock_median_mhz"] is not None:
        evidence.append(f"SM clock under load: min {s['sm_clock_min_mhz']:.0f}, median {s['sm_clock_median_mhz']:.0f}, "
                        f"max {s['sm_clock_max_mhz']:.0f} MHz")
    limit_w = d.get("limit_w")
    if limit_w:
        evidence.append(f"enforced power limit {limit_w:g} W ({d.get('limit_source') or 'snapshot'})")
    res.evidence = evidence
    return res


def _inputs(g: int, d: PowerLoad, s: PowerStats, temps: dict[int, float], p: PowerParams
            ) -> tuple[dict[str, float | None], dict[str, str], dict[str, float | None], dict[str, str | float],
                       list[str]]:
    """Metrics, units, limits, facts and notes (what could not be judged) of one GPU's load."""
    n = s["load_samples"]
    metrics: dict[str, float | None] = {"load_samples": n, "sdc_events": int(d.get("sdc_events", 0))}
    units = {"load_samples": "count", "sdc_events": "count"}
    limits: dict[str, float | None] = dict.fromkeys(("hw_fail_bar", "hw_warn_limit", "power_fail_fraction",
                                                      "power_site_fraction", "temp_peer_warn_c", "xid_limit"))
    facts: dict[str, str | float] = {"sdc_detail": d.get("sdc_detail") or "wrong GEMM result"}
    notes: list[str] = []
    if s["reason_samples"]:
        metrics.update(hw_slowdown_samples=s["hw_slowdown_samples"], hw_slowdown_share=s["hw_slowdown_share"])
        units.update(hw_slowdown_samples="count", hw_slowdown_share="")
        limits.update(hw_fail_bar=hw_fail_bar(n, p), hw_warn_limit=0)
        facts.update(hw_reasons="/".join(s["hw_reasons_seen"]) or "hardware slowdown", hw_clock=_hw_clock(s),
                     hw_fail_bar=hw_fail_bar(n, p))
    else:
        notes.append("clock-event reasons not readable: hardware slowdown not judged")
    notes.extend(_power_reach(d, s, p, metrics, units, limits, facts))
    t = s["temperature_median_c"]
    if t is not None:
        metrics.update(temperature_median_c=t, temperature_max_c=s["temperature_max_c"])
        units.update(temperature_median_c="C", temperature_max_c="C")
        peers = [v for pg, v in temps.items() if pg != g]
        if peers and g in temps:
            peers_c = statistics.median(peers)
            facts["peers_c"] = peers_c
            metrics["temperature_over_peers_c"], units["temperature_over_peers_c"] = round(t - peers_c, 1), "C"
            limits["temp_peer_warn_c"] = float(p["temp_peer_warn_c"])
        else:
            notes.append("no peer GPU to compare temperatures with")
    xid = d.get("xid")
    if xid is not None:
        xids = sorted(set(int(x) for x in xid))
        metrics["xid_events"], units["xid_events"], limits["xid_limit"] = len(xids), "count", 0
        facts["xids"] = ", ".join(map(str, xids))
    if s["sm_clock_median_mhz"] is not None:
        metrics.update(sm_clock_median_mhz=s["sm_clock_median_mhz"], sm_clock_min_mhz=s["sm_clock_min_mhz"])
        units.update(sm_clock_median_mhz="MHz", sm_clock_min_mhz="MHz")
    return metrics, units, limits, facts, notes


def _hw_clock(s: PowerStats) -> str:
    if s["sm_clock_hw_median_mhz"] is None:
        return ""
    clock = f", SM clock median {s['sm_clock_hw_median_mhz']:.0f} MHz in those samples"
    if s["sm_clock_other_median_mhz"] is not None:
        clock += f" vs {s['sm_clock_other_median_mhz']:.0f} MHz otherwise"
    return clock


def _power_reach(d: PowerLoad, s: PowerStats, p: PowerParams, metrics: dict[str, float | None],
                 units: dict[str, str], limits: dict[str, float | None], facts: dict[str, str | float]) -> list[str]:
    """The power-reach inputs (into metrics, units, limits, facts) and what could not be judged."""
    limit = d.get("limit_w")
    if s["power_samples"]:
        metrics.update(power_top_mean_w=s["power_top_mean_w"], power_mean_w=s["power_mean_w"])
        units.update(power_top_mean_w="W", power_mean_w="W")
    if limit:
        metrics["power_limit_w"], units["power_limit_w"] = limit, "W"
    fraction_of_limit = s["power_fraction_of_limit"]
    if fraction_of_limit is not None:
        frac = float(p["power_fail_fraction"])
        metrics["power_fraction_of_limit"], units["power_fraction_of_limit"] = fraction_of_limit, ""
        site_clocks = s["reason_counts"].get("applications_clocks_setting", 0)
        site = bool(site_clocks) and fraction_of_limit < frac
        limits.update(power_fail_fraction=None if site else frac, power_site_fraction=frac if site else None)
        facts.update(top_fraction=f"{float(p['power_top_fraction']):.0%}", power_top_text=_fmt_w(s["power_top_mean_w"]),
                     power_limit_text=_fmt_w(limit), site_clocks=site_clocks)
        return []
    if not s["power_samples"]:
        return ["power not readable (NVML): power reach not judged"]
    return [f"enforced power limit not read ({d.get('limit_source') or 'unknown'}): power reach not judged"]


def _ok_summary(s: PowerStats, limit: float | None, notes: list[str]) -> str:
    ok_parts = []
    if s["power_fraction_of_limit"] is not None:
        ok_parts.append(f"power {_fmt_w(s['power_top_mean_w'])} = {s['power_fraction_of_limit']:.2f} of the "
                        f"{_fmt_w(limit)} limit")
    elif s["power_top_mean_w"] is not None:
        ok_parts.append(f"power {_fmt_w(s['power_top_mean_w'])}")
    if s["sm_clock_median_mhz"] is not None:
        ok_parts.append(f"SM clock median {s['sm_clock_median_mhz']:.0f} MHz")
    if s["reason_samples"]:
        ok_parts.append(f"no hardware slowdown in {s['load_samples']} load samples")
    if s["temperature_median_c"] is not None:
        ok_parts.append(f"temperature median {s['temperature_median_c']:.0f} C")
    if s["sw_reasons_seen"]:
        ok_parts.append("/".join(s["sw_reasons_seen"]) + " seen (normal under a GEMM)")
    return "; ".join(ok_parts + notes) or "ok"
