"""Judging power and clock stability from sampled telemetry: pure functions, no NVML, no torch.

The eud.power check (gpucheck.eud.power) loads every GPU with a sustained GEMM while the parent
samples NVML (gpucheck.workers.sampler). This module turns those samples into one Result per GPU.
Every threshold comes from the check's parameters (`DEFAULTS` in gpucheck.eud.power) and is shown
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
from typing import Any, Iterable

from ..result import Action, Result, Status, Threshold, judge

CHECK_ID = "eud.power"

# NVML clock-event reasons that mean hardware cut the clocks (names as in gpucheck.telemetry.throttle).
HW_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
# Reasons that are the normal state of a loaded GPU or a software policy: evidence only.
SW_REASONS = ("sw_power_cap", "sw_thermal_slowdown")


def load_window(samples: Iterable[dict[str, Any]], start: float | None, end: float | None) -> list[dict[str, Any]]:
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


def _num(samples: list[dict[str, Any]], key: str) -> list[float]:
    return [float(s[key]) for s in samples if isinstance(s.get(key), (int, float)) and not isinstance(s.get(key), bool)]


def _names(s: dict[str, Any]) -> list[str]:
    return list(s.get("throttle_reason_names") or [])


def hw_fail_bar(n_load: int, p: dict[str, Any]) -> int:
    """How many hardware-slowdown samples fail a GPU: a meaningful share of the load, never one
    glitch."""
    return max(int(p["hw_min_samples"]), math.ceil(float(p["hw_fail_share"]) * n_load))


def gpu_stats(samples: list[dict[str, Any]], limit_w: float | None, p: dict[str, Any]) -> dict[str, Any]:
    """Numbers of one GPU's load window. Values are None when never read."""
    n = len(samples)
    power = _num(samples, "power_w")
    clocks = _num(samples, "sm_clock_mhz")
    temps = _num(samples, "temperature_c")
    reason_counts: dict[str, int] = {}
    hw_samples: list[dict[str, Any]] = []
    other_samples: list[dict[str, Any]] = []
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


def judge_power(loads: dict[int, dict[str, Any]], p: dict[str, Any]) -> list[Result]:
    """One result per GPU.

    loads[gpu] = {
      "samples": load-window samples (NvmlSession.sample keys + "time"),
      "limit_w": enforced power limit in W or None, "limit_source": text,
      "injected": [injection texts], "evidence": [lines], "load": text describing the load,
      "sdc_events": int (wrong GEMM results seen by the load), "sdc_detail": text,
      "xid": [Xid codes delivered during the load],
    }
    """
    stats = {g: gpu_stats(d["samples"], d.get("limit_w"), p) for g, d in loads.items()}
    min_n = int(p["min_load_samples"])
    temps = {g: s["temperature_median_c"] for g, s in stats.items()
             if s["temperature_median_c"] is not None and s["load_samples"] >= min_n}
    out: list[Result] = []
    for g in sorted(loads):
        out.append(_judge_one(g, loads[g], stats[g], temps, p))
    return out


def _judge_one(g: int, d: dict[str, Any], s: dict[str, Any], temps: dict[int, float], p: dict[str, Any]) -> Result:
    inj = list(d.get("injected", []))
    n = s["load_samples"]
    min_n = int(p["min_load_samples"])
    evidence = list(d.get("evidence", []))
    if d.get("load"):
        evidence.insert(0, d["load"])
    if n < min_n:
        r = Result(CHECK_ID, Status.ERROR,
                   f"could not judge: {n} telemetry sample(s) under load after the {p['warmup_s']:g} s warm-up, "
                   f"fewer than min_load_samples {min_n} (load too short, or NVML telemetry missing)",
                   gpu=g, injected=inj, evidence=evidence)
        r.metric("load_samples", n, "count")
        return r
    if s["power_samples"] == 0 and s["clock_samples"] == 0 and s["reason_samples"] == 0:
        r = Result(CHECK_ID, Status.ERROR,
                   "could not judge: NVML returned no power, SM clock or clock-event reading during the load",
                   gpu=g, injected=inj, evidence=evidence)
        r.metric("load_samples", n, "count")
        return r

    metrics: dict[str, Any] = {}
    units: dict[str, str] = {}
    thresholds: list[Threshold] = []
    causes: dict[str, str] = {}
    actions: dict[str, Action] = {}
    notes: list[str] = []

    def m(name: str, value: Any, unit: str) -> None:
        metrics[name] = value
        units[name] = unit

    m("load_samples", n, "count")
    m("sdc_events", int(d.get("sdc_events", 0)), "count")
    thresholds.append(Threshold("sdc_events", ">", 0, Status.FAIL, "count"))
    if d.get("sdc_events"):
        causes["sdc_events"] = f"silent data corruption during the power load: {d.get('sdc_detail') or 'wrong GEMM result'}"
    actions["sdc_events"] = Action.DRAIN

    # -- clocks cut by hardware
    if s["reason_samples"]:
        bar = hw_fail_bar(n, p)
        m("hw_slowdown_samples", s["hw_slowdown_samples"], "count")
        m("hw_slowdown_share", s["hw_slowdown_share"], "")
        thresholds.append(Threshold("hw_slowdown_samples", ">=", bar, Status.FAIL, "count"))
        thresholds.append(Threshold("hw_slowdown_samples", ">", 0, Status.WARN, "count"))
        reasons = "/".join(s["hw_reasons_seen"]) or "hardware slowdown"
        clock = ""
        if s["sm_clock_hw_median_mhz"] is not None:
            clock = f", SM clock median {s['sm_clock_hw_median_mhz']:.0f} MHz in those samples"
            if s["sm_clock_other_median_mhz"] is not None:
                clock += f" vs {s['sm_clock_other_median_mhz']:.0f} MHz otherwise"
        if s["hw_slowdown_samples"] >= bar:
            causes["hw_slowdown_samples"] = (f"clock cut by hardware under load: {reasons} in "
                                             f"{s['hw_slowdown_samples']} of {n} load samples{clock}")
        else:
            causes["hw_slowdown_samples"] = (f"{reasons} in {s['hw_slowdown_samples']} of {n} load samples, below the "
                                             f"fail bar of {bar}{clock}")
        actions["hw_slowdown_samples"] = Action.DRAIN if s["hw_slowdown_samples"] >= bar else Action.INVESTIGATE
    else:
        notes.append("clock-event reasons not readable: hardware slowdown not judged")

    # -- power reach
    limit = d.get("limit_w")
    if s["power_samples"]:
        m("power_top_mean_w", s["power_top_mean_w"], "W")
        m("power_mean_w", s["power_mean_w"], "W")
    if limit:
        m("power_limit_w", limit, "W")
    if s["power_fraction_of_limit"] is not None:
        frac = float(p["power_fail_fraction"])
        m("power_fraction_of_limit", s["power_fraction_of_limit"], "")
        thresholds.append(Threshold("power_fraction_of_limit", "<", frac, Status.FAIL, ""))
        site_clocks = s["reason_counts"].get("applications_clocks_setting", 0)
        causes["power_fraction_of_limit"] = (
            f"cannot reach its power limit under load: top {float(p['power_top_fraction']):.0%} of samples average "
            f"{_fmt_w(s['power_top_mean_w'])} of the {_fmt_w(limit)} enforced limit")
        actions["power_fraction_of_limit"] = Action.DRAIN
        if site_clocks and s["power_fraction_of_limit"] < frac:
            # Clocks held down by a site setting explain a low draw: that is not a hardware fault.
            thresholds[-1] = Threshold("power_fraction_of_limit", "<", frac, Status.WARN, "")
            causes["power_fraction_of_limit"] += (f"; applications_clocks_setting seen in {site_clocks} samples "
                                                 "(clocks set by the site hold the power down)")
            actions["power_fraction_of_limit"] = Action.INVESTIGATE
    elif not s["power_samples"]:
        notes.append("power not readable (NVML): power reach not judged")
    else:
        notes.append(f"enforced power limit not read ({d.get('limit_source') or 'unknown'}): power reach not judged")

    # -- temperature against the peers
    t = s["temperature_median_c"]
    if t is not None:
        m("temperature_median_c", t, "C")
        m("temperature_max_c", s["temperature_max_c"], "C")
        peers = [v for pg, v in temps.items() if pg != g]
        if peers and g in temps:
            node = statistics.median(peers)
            over = round(t - node, 1)
            m("temperature_over_peers_c", over, "C")
            thresholds.append(Threshold("temperature_over_peers_c", ">", float(p["temp_peer_warn_c"]), Status.WARN, "C"))
            causes["temperature_over_peers_c"] = (f"hotter than its peers under the same load: median {t:.0f} C vs "
                                                 f"{node:.0f} C on the other GPUs (max {s['temperature_max_c']:.0f} C)")
            actions["temperature_over_peers_c"] = Action.INVESTIGATE
        else:
            notes.append("no peer GPU to compare temperatures with")

    # -- Xid events during the load
    xids = sorted(set(int(x) for x in (d.get("xid") or [])))
    if d.get("xid") is not None:
        m("xid_events", len(xids), "count")
        thresholds.append(Threshold("xid_events", ">", 0, Status.WARN, "count"))
        if xids:
            causes["xid_events"] = f"Xid {', '.join(map(str, xids))} during the load (see the xid check)"
        actions["xid_events"] = Action.INVESTIGATE

    if s["sm_clock_median_mhz"] is not None:
        m("sm_clock_median_mhz", s["sm_clock_median_mhz"], "MHz")
        m("sm_clock_min_mhz", s["sm_clock_min_mhz"], "MHz")

    ok_parts = []
    if s["power_fraction_of_limit"] is not None:
        ok_parts.append(f"power {_fmt_w(s['power_top_mean_w'])} = {s['power_fraction_of_limit']:.2f} of the "
                        f"{_fmt_w(limit)} limit")
    elif s["power_top_mean_w"] is not None:
        ok_parts.append(f"power {_fmt_w(s['power_top_mean_w'])}")
    if s["sm_clock_median_mhz"] is not None:
        ok_parts.append(f"SM clock median {s['sm_clock_median_mhz']:.0f} MHz")
    if s["reason_samples"]:
        ok_parts.append(f"no hardware slowdown in {n} load samples")
    if t is not None:
        ok_parts.append(f"temperature median {t:.0f} C")
    if s["sw_reasons_seen"]:
        ok_parts.append("/".join(s["sw_reasons_seen"]) + " seen (normal under a GEMM)")
    ok = "; ".join(ok_parts + notes) or "ok"
    res = judge(CHECK_ID, thresholds, metrics, gpu=g, units=units, ok_summary=ok, causes=causes, actions=actions)
    if res.status != Status.PASS and notes:
        res.summary += "; " + "; ".join(notes)
    res.injected = inj
    counts = ", ".join(f"{k} {v}" for k, v in sorted(s["reason_counts"].items())) or "none"
    evidence.append(f"{n} load samples ({s['power_samples']} with power, {s['clock_samples']} with SM clock, "
                    f"{s['reason_samples']} with clock-event reasons); reasons seen (samples): {counts}")
    if s["sm_clock_median_mhz"] is not None:
        evidence.append(f"SM clock under load: min {s['sm_clock_min_mhz']:.0f}, median {s['sm_clock_median_mhz']:.0f}, "
                        f"max {s['sm_clock_max_mhz']:.0f} MHz")
    if limit:
        evidence.append(f"enforced power limit {limit:g} W ({d.get('limit_source') or 'snapshot'})")
    res.evidence = evidence
    return res
