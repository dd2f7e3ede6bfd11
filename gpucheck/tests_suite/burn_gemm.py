"""burn.gemm: GEMMs on every GPU at once, verified, compared with the SKU and with the peers.

One worker process per GPU (gpucheck.workers.pool), all loaded together, runs
gpucheck.compute.gemm.burn_worker for the burn's duration; the parent samples NVML meanwhile
(gpucheck.workers.sampler). Per GPU one result:

- fail "silent data corruption" when a result differed bitwise between two runs of the same
  operands, or from the float64 reference beyond the dtype's rounding bound (dtype, set,
  iteration and the size of the error in the summary and evidence);
- fail "hang" when the worker stopped answering (killed), fail with the error text when it
  crashed (CUDA error, killed by the OOM killer);
- warn / fail "slow GPU" when its median TFLOP/s is below the SKU floor (a fraction of the
  datasheet dense rate, gpucheck.data.sku) or more than peer_warn_fraction / peer_fail_fraction
  below the node median; throttling or low clocks seen by the sampler are named as the likely
  cause;
- error when gpucheck could not judge (no CUDA in torch, out of GPU memory, interrupted before
  any result).

`--device cpu --workers N` runs the same code on CPU workers standing in for GPUs (small
matrices): that is how the whole model is tested without a GPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..compute.gemm import DTYPES, DtypeError, parse_dtypes
from ..data.sku import Sku, lookup
from ..platform.durations import parse_duration
from ..sdk import (MAX_DIMENSION, Action, Context, InjectionArgs, Key, Level, Limit, Need, Result, Rule, Status,
                   define, evaluate, fraction, injections_for_gpu, option, settle)
from ..sdk.workers import (LoadParams, LoadTime, finish_result, guarded_targets, job_gpu, progress_evidence,
                           returned_data, run_per_gpu, stopped_early, telemetry_summary, unfinished_result, worker_data)

if TYPE_CHECKING:  # pragma: no cover
    from ..compute.gemm import BurnArgs
    from ..platform.telemetry.model import TelemetrySummary
    from ..sdk.workers import (BurnDtype, BurnProgress, BurnResult, PerGpuRun, Promise, SdcEvent, SetupError,
                               WorkerJob, WorkerOutcome)

CHECK_ID = "burn.gemm"


class BurnParams(LoadParams):
    """burn.gemm's parameters (DEFAULTS, merged with the config's [checks."burn.gemm"])."""

    dtypes_level2: list[str]
    dtypes_level3: list[str]
    dtypes_level4: list[str]
    size: int
    cpu_size: int
    repeats: int
    window_s: float
    ref_rows: int
    ref_every_s: float
    seed: int
    sku_warn_fraction: float
    sku_fail_fraction: float
    sku_min_size: int
    peer_warn_fraction: float
    peer_fail_fraction: float


DEFAULTS: BurnParams = {
    # Length and dtypes by level (level 2: a short burn; 3 and 4: longer, every dtype).
    "duration_s_level2": 30.0,
    "duration_s_level3": 300.0,
    "duration_s_level4": 3600.0,
    "dtypes_level2": ["bf16"],
    "dtypes_level3": list(DTYPES),
    "dtypes_level4": list(DTYPES),
    "size": 8192,  # n of the n x n operands on a GPU
    "cpu_size": 256,  # ... on CPU workers
    "repeats": 16,  # GEMMs per operand set; the first and the last are compared bitwise
    "window_s": 1.0,  # throughput window
    "ref_rows": 8,  # rows compared with the float64 reference
    "ref_every_s": 1.0,  # at most one reference check per this many seconds
    "seed": 0,
    "sku_warn_fraction": 0.5,  # warn below this fraction of the SKU's dense peak
    "sku_fail_fraction": 0.3,  # fail below this fraction
    "sku_min_size": 4096,  # smaller GEMMs do not reach the dense rate: no SKU floor
    "peer_warn_fraction": 0.08,  # warn when this far below the node median
    "peer_fail_fraction": 0.25,  # fail when this far below
    # A worker silent this long is hung. Workers report once per operand set, so this must exceed
    # the time of `repeats` GEMMs (bf16 8192 on an H100: ~25 ms; fp64 32768: ~20 s).
    "heartbeat_timeout_s": 30.0,
    "startup_timeout_s": 120.0,  # spawn + torch import + CUDA init
    "sample_interval_s": 1.0,  # NVML sampling period
}
# What a setting may be where gpucheck.core.config.conventional_limit is not enough: sizes and counts
# of work are at least 1 (0 would examine nothing).
LIMITS = {k: Limit("int", 1) for k in ("size", "cpu_size", "repeats", "ref_rows")}

_LEVEL_KEYS = (2, 3, 4)


@dataclass(frozen=True)
class BurnOptions:
    """`gpucheck burn`'s options (None: not given, the level's default or the config's applies)."""

    duration_s: float | None = option(
        "--duration", parse=parse_duration,
        help="How long to burn: 30s, 5m, 1h or seconds (default by level: 30 s at 2, 300 s at 3, 3600 s at 4).")
    dtypes: Sequence[str] | str | None = option(
        "--dtype", "list", parse=parse_dtypes, error=DtypeError,
        help=f"Comma list of {','.join(DTYPES)} (repeatable; default by level: bf16 at 2, all at 3 and 4). "
             "fp8 runs on GPUs with compute capability >= 8.9 only; elsewhere it is skipped, "
             "and the result says why.")
    size: int | None = option("--size", "int", low=16, high=MAX_DIMENSION,
                              help="n of the n x n operands (default 8192 on GPUs, 256 on CPU workers).")


# The time functions (parameters, duration, budget, promise, least slice): gpucheck.workers.per_gpu.
TIME = LoadTime(CHECK_ID, DEFAULTS, "burn", BurnOptions)
_params = TIME.params
burn_duration = TIME.duration


def _level(ctx: Context) -> int:
    return max(_LEVEL_KEYS[0], min(_LEVEL_KEYS[-1], int(ctx.level)))


def _device(ctx: Context) -> str:
    return "cpu" if ctx.device == "cpu" else "cuda"


def _inject(inj: Any, args: dict[str, Any]) -> None:
    if inj.kind == "bitflip":
        args["bitflip"] = {k: (None if inj.get(k) is None else int(inj.get(k))) for k in ("bit", "row", "col")}
        args["bitflip"]["set"] = int(inj.get("set", 1))
    elif inj.kind == "slow":
        args["slow"] = fraction(inj, "factor", 0.5)
    else:
        args["hang_after_s"] = float(inj.get("after", 1.0))


def _injection_args(ctx: Context, gpu: int) -> InjectionArgs:
    """Worker args for the injections that target `gpu`, their texts, and a usage problem."""
    return injections_for_gpu(ctx.injections, gpu, ("bitflip", "slow", "hang"), _inject)


@define(
    CHECK_ID,
    title="Burn-in GEMMs on every GPU at once: bitwise repeats, float64 reference, SKU and peer throughput",
    level=Level.STANDARD,
    needs=(Need.TORCH, Need.GPU),
    budget_fn=TIME.budget,
    detects="silent data corruption in GEMMs, slow (throttled, degraded) GPUs, GPUs that hang or crash under load",
    defaults=DEFAULTS,
    limits=LIMITS,
    injects=("bitflip", "slow", "hang"),
    min_slice_fn=TIME.min_slice,
    top_level=Level.BURN_IN,
    options=BurnOptions,
)
def burn_gemm(ctx: Context) -> list[Result]:
    p, promise, problem = TIME.start(ctx)
    if problem is not None:
        return [problem]
    device = _device(ctx)
    duration = promise.seconds
    notes: list[str] = []
    given = ctx.options_for(BurnOptions)
    try:
        by_level = {2: p["dtypes_level2"], 3: p["dtypes_level3"], 4: p["dtypes_level4"]}
        dtypes = parse_dtypes(given.dtypes or by_level[_level(ctx)])
    except DtypeError as e:
        return [Result(CHECK_ID, Status.ERROR, f"bad dtype list: {e}")]
    size = int(given.size or (p["cpu_size"] if device == "cpu" else p["size"]))

    targets, results, guard = guarded_targets(ctx, device, CHECK_ID, "burned")  # GPUs in use: skipped
    if not targets:
        if results:
            return results
        return [Result(CHECK_ID, Status.SKIP, "no GPU selected to burn")]

    def make_args(g: int) -> "BurnArgs":
        return {"duration_s": duration, "dtypes": dtypes, "size": size, "repeats": p["repeats"],
                "window_s": p["window_s"], "ref_rows": p["ref_rows"], "ref_every_s": p["ref_every_s"],
                "seed": p["seed"]}

    run: "PerGpuRun[BurnResult | SetupError, BurnProgress]" = run_per_gpu(
        ctx, CHECK_ID, "gpucheck.compute.gemm:burn_worker", targets, device=device, p=p,
        budget_s=TIME.pool_budget_s(p, duration), make_args=make_args,
        injection_args=lambda g: _injection_args(ctx, g),
    )
    results.extend(run.results)
    if not run.jobs:
        return results
    names = {t["gpu"]: t["name"] for t in targets}
    results.extend(_judge(ctx, p, device, promise, run.jobs, run.outcomes, run.sampler, names, run.injected,
                          notes, run.elapsed_s))
    return sorted(guard.annotate(results), key=lambda r: (r.gpu is None, r.gpu or 0))


# ---------------------------------------------------------------------------------------------
# judging


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _describe_event(ev: "SdcEvent") -> str:
    where = f"{ev['dtype']} set {ev['set']} iteration {ev['iteration']} ({ev['distribution']} operands)"
    if ev["kind"] == "repeat":
        return (f"{where}: {ev['elements']} element(s) differ bitwise between two runs of the same "
                f"operands, max error {_fmt(ev['max_abs_error'])} (relative {_fmt(ev['max_rel_error'])}), "
                f"first at {tuple(ev['first'])}, odd one out: {ev['odd_one_out']}")
    return (f"{where}: {ev['elements']} element(s) off the float64 reference, max error "
            f"{_fmt(ev['max_abs_error'])} ({_fmt(ev['normalized_error'])} of |A|.|B|, tolerance "
            f"{_fmt(ev['tolerance'])}), at {tuple(ev['first'])}: got {_fmt(ev['got'])}, "
            f"expected {_fmt(ev['expected'])}")


def _likely_cause(tel: "TelemetrySummary", node_clock: float | None, common: set[str]) -> str:
    """Why a GPU is slow, from its telemetry: slowdown reasons its peers do not all share (a
    power cap every GPU hits under a GEMM burn explains nothing), and a low SM clock."""
    if not tel["samples"]:
        return " (no NVML telemetry to name a cause)"
    parts = []
    reasons = [r for r in tel["slowdown_reasons"] if r not in common] or []
    if reasons:
        t = tel["temperature_max_c"]
        parts.append("/".join(reasons) + " during the burn" + (f" (max {t:.0f} C)" if t is not None else ""))
    clock = tel["sm_clock_median_mhz"]
    if clock is not None and node_clock and clock < 0.95 * node_clock:
        parts.append(f"SM clock median {clock:.0f} MHz vs {node_clock:.0f} MHz on the node")
    if parts:
        return "; likely cause: " + ", ".join(parts)
    if tel["slowdown_reasons"]:
        return f"; {'/'.join(tel['slowdown_reasons'])} seen, as on the other GPUs"
    return "; no clock throttling seen"


def _judge(ctx: Context, p: BurnParams, device: str, promise: "Promise", jobs: "list[WorkerJob]",
           outcomes: "dict[str, WorkerOutcome[BurnResult | SetupError, BurnProgress]]", sampler: Any,
           names: dict[int, str | None], injected: dict[int, list[str]], notes: list[str],
           elapsed: float) -> list[Result]:
    gpus = [(j, job_gpu(j)) for j in jobs]
    tel = {g: telemetry_summary(sampler, g, device) for _, g in gpus}
    data: dict[int, BurnResult] = {}
    for j, g in gpus:
        d = worker_data(outcomes.get(j.worker_id))
        if d is not None:
            data[g] = d
    # Node medians: throughput per dtype, SM clock.
    per_dtype: dict[str, list[float]] = {}
    for d in data.values():
        for dt, rec in d.get("dtypes", {}).items():
            tflops = rec.get("tflops")
            if tflops is not None:
                per_dtype.setdefault(dt, []).append(float(tflops))
    medians = {dt: statistics.median(v) for dt, v in per_dtype.items() if len(v) >= 2}
    clocks = [t["sm_clock_median_mhz"] for g, t in tel.items() if g in data and t["sm_clock_median_mhz"]]
    node_clock = statistics.median(clocks) if len(clocks) >= 2 else None

    def common_reasons(gpu: int) -> set[str]:
        """Slowdown reasons every other sampled GPU showed too."""
        others = [set(t["slowdown_reasons"]) for g, t in tel.items() if g != gpu and t["samples"]]
        return set.intersection(*others) if others else set()

    out: list[Result] = []
    for j, g in gpus:
        oc = outcomes.get(j.worker_id)
        t = tel[g]
        inj = injected.get(g, [])
        r = unfinished_result(CHECK_ID, g, oc, inj, worker="burn", setup_verb="burn", partial=_partial_metrics)
        if r is None:
            r = _judge_data(p, device, g, returned_data(oc), names.get(g), medians, t, node_clock, len(jobs), inj,
                            common_reasons(g))
            stopped_early(r, outcomes[j.worker_id], promise)
        out.append(finish_result(r, t, device=device, gpu=g, notes=notes, elapsed_s=elapsed))
    return out


def _partial_metrics(r: Result, progress: "BurnProgress") -> None:
    if progress.get("dtype") and progress.get("tflops") is not None:
        r.metric(f"tflops_{progress['dtype']}", float(progress["tflops"]), "TFLOP/s")
    if progress.get("iterations") is not None:
        r.metric("iterations", int(progress["iterations"]), "count")
    if progress:
        r.evidence.append(progress_evidence(progress))


def _dtype_rules(dt: str) -> tuple[Rule, ...]:
    """A dtype's TFLOP/s against the SKU floor (a fraction of the dense peak) and the node median."""
    floor = f"slow GPU: {dt} below the {{sku}} floor ({{sku_warn_fraction}} of {{{dt}_peak}} dense TFLOP/s){{likely}} ({{detail}})"
    peers = (f"slow GPU: {dt} {{{dt}_deficit_text}}% below the node median of {{{dt}_median_text}} TFLOP/s{{likely}} "
             "({detail})")
    m, d = f"tflops_{dt}", f"peer_deficit_{dt}"
    return (Rule(m, "<", Key(f"{dt}_warn_tflops"), Status.WARN, Action.INVESTIGATE, floor, "TFLOP/s"),
            Rule(m, "<", Key(f"{dt}_fail_tflops"), Status.FAIL, Action.DRAIN, floor, "TFLOP/s"),
            Rule(d, ">", Key(f"{dt}_peer_warn_pct"), Status.WARN, Action.INVESTIGATE, peers, "%"),
            Rule(d, ">", Key(f"{dt}_peer_fail_pct"), Status.FAIL, Action.DRAIN, peers, "%"))


# Wrong results first (when a GPU both computes wrongly and is slow, the summary names the
# corruption first), then speed per dtype (warn -> investigate, fail -> drain), then Xid events
# during the burn. Limits by key (see _dtype_inputs); a dtype not run or without a floor: off.
RULES: tuple[Rule, ...] = (
    Rule("sdc_events", ">", 0, Status.FAIL, Action.DRAIN, "silent data corruption: {sdc_text} ({detail})", "count"),
    *(rule for dt in DTYPES for rule in _dtype_rules(dt)),
    Rule("xid_events", ">", Key("xid_limit"), Status.WARN, Action.INVESTIGATE,
         "Xid {xids} during the burn (see the xid check) ({detail})", "count"),
)


def _dtype_inputs(p: BurnParams, dt: str, r: "BurnDtype", size: int, sku: Sku | None,
                  medians: dict[str, float], metrics: dict[str, float | None], units: dict[str, str],
                  limits: dict[str, float | None], facts: dict[str, str | None]) -> tuple[str | None, list[str]]:
    """One dtype's metrics, units, limits and facts (into the dicts given); its part of the ok
    summary (None: nothing measured) and evidence."""
    tf = r.get("tflops")
    metrics[f"tflops_{dt}"] = None if tf is None else float(tf)
    metrics[f"iterations_{dt}"] = int(r.get("iterations", 0))
    metrics[f"repeat_checks_{dt}"] = int(r.get("repeat_checks", 0))
    metrics[f"reference_checks_{dt}"] = int(r.get("reference_checks", 0))
    metrics[f"reference_max_error_{dt}"] = float(r.get("reference_max_error", 0.0))
    units.update({f"tflops_{dt}": "TFLOP/s", f"iterations_{dt}": "count", f"repeat_checks_{dt}": "count",
                  f"reference_checks_{dt}": "count"})
    evidence = [f"{dt}: {r.get('sets', 0)} operand sets x {r.get('repeats')} GEMMs of {size}x{size} "
                f"in {r.get('seconds', 0):.1f} s; {r.get('reference_elements', 0)} elements compared "
                f"with float64, max |C-ref|/(|A|.|B|) {_fmt(float(r.get('reference_max_error', 0.0)))} "
                f"(tolerance {_fmt(float(r.get('reference_tolerance', 0.0)))})"]
    if tf is None:
        return None, evidence
    part = f"{dt} {_fmt(float(tf))} TFLOP/s"
    peak = sku.peak(dt) if sku is not None else None
    if peak and size >= int(p["sku_min_size"]):
        limits[f"{dt}_warn_tflops"] = round(peak * float(p["sku_warn_fraction"]), 1)
        limits[f"{dt}_fail_tflops"] = round(peak * float(p["sku_fail_fraction"]), 1)
        facts[f"{dt}_peak"] = f"{peak:g}"
        metrics[f"peak_fraction_{dt}"] = round(float(tf) / peak, 3)
        part += f" ({float(tf) / peak:.2f} of the {sku.name} dense peak)"  # type: ignore[union-attr]
    elif peak:
        evidence.append(f"{dt}: no SKU floor at size {size} (below sku_min_size {p['sku_min_size']})")
    if dt in medians:
        med = medians[dt]
        deficit = max(0.0, (med - float(tf)) / med * 100.0) if med > 0 else 0.0
        metrics[f"peer_deficit_{dt}"], units[f"peer_deficit_{dt}"] = round(deficit, 1), "%"
        limits[f"{dt}_peer_warn_pct"] = 100.0 * float(p["peer_warn_fraction"])
        limits[f"{dt}_peer_fail_pct"] = 100.0 * float(p["peer_fail_fraction"])
        facts.update({f"{dt}_deficit_text": f"{deficit:.0f}", f"{dt}_median_text": _fmt(med)})
    return part, evidence


def _judge_data(p: BurnParams, device: str, g: int, d: "BurnResult", snap_name: str | None,
                medians: dict[str, float], tel: "TelemetrySummary", node_clock: float | None,
                n_workers: int, inj: list[str], common: set[str]) -> Result:
    dev_info = d.get("device", {})
    name = dev_info.get("name") or snap_name
    sku: Sku | None = lookup(name) if device == "cuda" else None
    size = int(d.get("config", {}).get("size", 0))
    metrics: dict[str, float | None] = {}  # per dtype: the names carry it
    units: dict[str, str] = {}
    limits: dict[str, float | None] = {"xid_limit": None, **{f"{dt}_{k}": None for dt in DTYPES
                                                   for k in ("warn_tflops", "fail_tflops", "peer_warn_pct", "peer_fail_pct")}}
    facts: dict[str, str | None] = {"likely": _likely_cause(tel, node_clock, common), "sku": sku.name if sku else None,
                             "sku_warn_fraction": f"{float(p['sku_warn_fraction']):g}"}
    evidence: list[str] = []
    ok_parts: list[str] = []
    for dt, r in d.get("dtypes", {}).items():
        part, ev = _dtype_inputs(p, dt, r, size, sku, medians, metrics, units, limits, facts)
        evidence.extend(ev)
        if part is not None:
            ok_parts.append(part)
    n_sdc = int(d.get("sdc_count", 0))
    metrics["sdc_events"], units["sdc_events"] = n_sdc, "count"
    events = d.get("sdc", [])
    facts["sdc_text"] = ((_describe_event(events[0]) + (f"; {n_sdc - 1} more event(s)" if n_sdc > 1 else ""))
                         if events else f"{n_sdc} wrong result(s), none recorded")
    evidence.extend("SDC " + _describe_event(ev) for ev in events)
    if tel["samples"]:
        metrics["xid_events"], units["xid_events"], limits["xid_limit"] = len(tel["xid"]), "count", 0
        facts["xids"] = ", ".join(map(str, tel["xid"]))
    if not ok_parts:
        skipped = d.get("skipped", {})
        why = "; ".join(f"{dt}: {w}" for dt, w in skipped.items()) or "nothing was measured"
        # Out of GPU memory is "could not judge"; dtypes this GPU cannot run are a plain skip.
        status = Status.ERROR if d.get("allocation_errors") else Status.SKIP
        return Result(CHECK_ID, status, f"no dtype burned: {why}", gpu=g, injected=inj, metrics=metrics, units=units)
    res = evaluate(CHECK_ID, RULES, metrics, limits=limits, facts=facts, units=units, gpu=g,
                   ok_summary=_ok_summary(d, ok_parts, n_workers, medians, device, sku, name))
    res.evidence = _evidence(d, evidence, device, name, sku, inj)
    res.injected = list(inj)
    return _unallocated(res, d)


def _unallocated(res: Result, d: "BurnResult") -> Result:
    """A dtype whose operands could not be allocated (gpucheck's own limit) was not examined: the
    result is an error unless a fail was found (result.outcome), the earlier summary kept as evidence."""
    missing = [dt for dt in d.get("allocation_errors", [])]
    if not missing:
        return res
    for dt in missing:
        res.unjudged[f"{dt} (operands not allocated)"] = Status.ERROR
    before = res.status
    settle(res)
    if res.status is Status.ERROR and before is not Status.ERROR:
        res.evidence.insert(0, f"{before.value} for the dtypes burned: {res.summary}")
        skipped = d.get("skipped", {})
        res.summary = "not every dtype burned: " + "; ".join(f"{dt}: {skipped.get(dt, 'not allocated')}"
                                                             for dt in missing)
    return res


def _ok_summary(d: "BurnResult", ok_parts: list[str], n_workers: int, medians: dict[str, float], device: str,
                sku: Sku | None, name: Any) -> str:
    checks_repeat = sum(int(r.get("repeat_checks", 0)) for r in d.get("dtypes", {}).values())
    checks_ref = sum(int(r.get("reference_checks", 0)) for r in d.get("dtypes", {}).values())
    ok = ", ".join(ok_parts) + f"; {checks_repeat} bitwise repeat and {checks_ref} float64 reference checks clean"
    if n_workers < 2:
        ok += "; no peers to compare"
    elif not medians:
        ok += "; no peer result to compare with"
    if device == "cuda" and sku is None:
        ok += f"; SKU {name!r} not in the table: judged by peers only"
    for dt, why in d.get("skipped", {}).items():
        ok += f"; {dt} skipped: {why}"
    return ok


def _evidence(d: "BurnResult", evidence: list[str], device: str, name: Any, sku: Sku | None,
              inj: list[str]) -> list[str]:
    if device == "cuda":
        evidence.insert(0, f"device {name!r}" + (f": SKU {sku.name} ({sku.source})" if sku else
                                                 ": not in the SKU table, judged by peers only"))
    for dt, why in d.get("skipped", {}).items():
        evidence.append(f"{dt} skipped: {why}")
    evidence.extend(d.get("notes", []))
    evidence.extend(f"injected {x}" for x in d.get("injected", []))
    if any(x.startswith("bitflip") for x in inj) and not d.get("injected"):
        evidence.append("the bitflip injection did not fire: the burn ended before its operand set")
    return evidence


CHECKS = [burn_gemm]
