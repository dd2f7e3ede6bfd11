"""eud.power: power and clock stability under a sustained GEMM on every GPU at once (level 3).

One worker per GPU runs burn's verified GEMM loop (gpucheck.compute.gemm:burn_worker, one dtype,
operands drawn from the normal distribution: the highest switching activity, the highest power)
for its duration (`--power-duration`); all GPUs are loaded together, as a node is in training.
The parent samples NVML meanwhile (gpucheck.workers.sampler: SM clock, temperature, power,
clock-event reasons, Xid events). gpucheck.eud.power_judge turns the samples of each GPU's load window (after `warmup_s`)
into one result per GPU: fail on clocks cut by hardware (hw_slowdown, hw_thermal_slowdown,
hw_power_brake_slowdown) in a meaningful share of the load samples, fail when the GPU cannot reach
`power_fail_fraction` of its enforced power limit, warn when it runs more than `temp_peer_warn_c`
hotter than its peers. A worker that hangs or crashes fails its GPU like burn.gemm does.

The samples come from the run's telemetry source (ctx.telemetry: live NVML, or a fake one in
tests). No power telemetry, no verdict: with CPU workers (`--device cpu`) and a source that has no
telemetry for them (NVML has none) the check is a skip that says why; on GPUs whose NVML does not
answer it is an error (could not judge).

Options (PowerOptions, `gpucheck eud --power-duration/--power-size`): duration_s, size. Fault injection (telemetry of GPU N
is altered after it is read, so the detectors are proven on real NVML data too):

    throttle:gpu=N[,reason=hw_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown][,factor=0.5]
    hot:gpu=N[,delta=15]          temperature + delta C
    lowpower:gpu=N[,factor=0.4]   power x factor
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..eud.power_judge import CHECK_ID, HW_REASONS, PowerLoad, PowerParams, judge_power, load_window
from ..platform.durations import parse_duration
from ..platform.telemetry.throttle import bit
from ..sdk import (MAX_DIMENSION, Context, InjectionArgs, Level, Limit, Need, Result, Slice, Status, choice, define,
                   flag_of, fraction, injections_for_gpu, option)
from ..sdk.workers import (CANCELLED, OVER_BUDGET, Promise, cut_short, deadline_problem, duration_slice,
                           guarded_targets, job_gpu, level_duration, promised, returned_data, run_per_gpu,
                           unfinished_result)

if TYPE_CHECKING:  # pragma: no cover
    from ..compute.gemm import BurnArgs
    from ..platform.telemetry.model import Sample
    from ..sdk.workers import BurnProgress, BurnResult, PerGpuRun, SetupError, WorkerJob, WorkerOutcome, WorkerProgress

DEFAULTS: PowerParams = {
    "duration_s_level3": 120.0,  # load per run at level 3 (plus warm-up and start-up)
    "duration_s_level4": 900.0,
    "warmup_s": 10.0,  # after the first GEMM window: excluded from judging
    "dtype": "bf16",  # GEMM dtype of the load (burn's names)
    "size": 8192,  # n of the n x n operands on a GPU
    "cpu_size": 128,  # ... on CPU workers (tests)
    "repeats": 16,
    "window_s": 1.0,  # throughput window of the worker (also its progress period)
    "ref_every_s": 5.0,  # float64 reference check period of the load (burn's verification)
    "sample_interval_s": 1.0,  # NVML sampling period
    "min_load_samples": 10,  # fewer samples after the warm-up: could not judge
    "hw_fail_share": 0.05,  # fail when hardware cut the clock in this share of load samples ...
    "hw_min_samples": 3,  # ... and in at least this many samples (one glitch is a warn)
    "power_top_fraction": 0.2,  # the top 20% of power samples ...
    "power_top_min_samples": 3,  # ... (at least 3) are averaged ...
    "power_fail_fraction": 0.6,  # ... and must reach this fraction of the enforced power limit
    "temp_peer_warn_c": 10.0,  # warn when the median load temperature is this far above the peers'
    "heartbeat_timeout_s": 30.0,
    "startup_timeout_s": 120.0,
}
# What a setting may be where gpucheck.core.config.conventional_limit is not enough: sizes and counts
# of work are at least 1 (0 would examine nothing).
LIMITS = {
    **{k: Limit("int", 1) for k in ("size", "cpu_size", "repeats", "min_load_samples", "hw_min_samples",
                                     "power_top_min_samples")},
    "warmup_s": Limit("real", 0),  # 0: judge from the first sample
}

_INJECTS = ("throttle", "hot", "lowpower")


@dataclass(frozen=True)
class PowerOptions:
    """`gpucheck eud`'s power options (None: not given, the level's default or the config's applies)."""

    duration_s: float | None = option("--power-duration", parse=parse_duration,
                                      help="How long eud.power sustains its GEMM load (default by level).")
    size: int | None = option("--power-size", "int", low=16, high=MAX_DIMENSION, metavar="N",
                              help="n of the n x n operands of eud.power's GEMM load (default 8192 on GPUs, "
                                   "128 on CPU workers).")


def _params(ctx: Context) -> PowerParams:
    return ctx.params(CHECK_ID, DEFAULTS)


def power_duration(ctx: Context, p: PowerParams | None = None) -> float:
    return level_duration(ctx, p or _params(ctx), ctx.options_for(PowerOptions).duration_s, lowest=3)


def _budget(ctx: Context) -> float:
    p = _params(ctx)
    return power_duration(ctx, p) + float(p["warmup_s"]) + float(p["startup_timeout_s"]) + 30.0


def _promise(ctx: Context, p: PowerParams | None = None) -> Promise:
    p = p or _params(ctx)
    return promised(ctx, p, "load (with its warm-up)", ctx.options_for(PowerOptions).duration_s,
                    flag=flag_of(PowerOptions, "duration_s"), lowest=3, extra_s=float(p["warmup_s"]))


def _min_slice(ctx: Context) -> Slice:
    """The workers' start-up floor, the warm-up and the whole promised load."""
    return duration_slice(ctx, _promise(ctx))


def no_telemetry(ctx: Context) -> str | None:
    """Why this run has no power telemetry to judge: CPU workers (NVML has none for them), or a
    telemetry source with none for the GPUs."""
    device = "cpu" if ctx.device == "cpu" else "cuda"
    if ctx.telemetry.watches(device):
        return None
    if device == "cpu":
        return ("no power telemetry: CPU workers stand in for GPUs and have no power, clock or clock-event "
                "readings; eud.power judges NVML telemetry under load (run it on GPUs)")
    return f"no power telemetry: {ctx.telemetry.description} has no load telemetry for the GPUs"


# ---------------------------------------------------------------------------------------------
# fault injection on telemetry


def _inject(inj: Any, spec: dict[str, Any]) -> None:
    if inj.kind == "throttle":
        reason = choice(inj, "reason", "hw_slowdown", HW_REASONS)
        spec["throttle"] = (reason, fraction(inj, "factor", 0.5))
    elif inj.kind == "hot":
        delta = float(inj.get("delta", 15.0))
        if delta <= 0:
            raise ValueError(f"delta must be > 0, not {delta}")
        spec["hot"] = delta
    else:
        spec["lowpower"] = fraction(inj, "factor", 0.4)


def injection_specs(ctx: Context, gpu: int) -> InjectionArgs:
    """The telemetry alterations that target `gpu`, their texts, and a usage problem."""
    return injections_for_gpu(ctx.injections, gpu, _INJECTS, _inject)


def apply_injections(samples: "list[Sample]", spec: dict[str, Any]) -> "list[Sample]":
    """Samples as if the hardware had done what `spec` (injection_specs) says (pure: returns new dicts)."""
    if not spec:
        return samples

    out = []
    for sample in samples:
        s = sample.copy()
        if "throttle" in spec:
            reason, factor = spec["throttle"]
            names = list(s.get("throttle_reason_names") or [])
            if reason not in names:
                names.append(reason)
            s["throttle_reason_names"] = names
            s["throttle_reasons"] = int(s.get("throttle_reasons") or 0) | bit(reason)
            clock = s.get("sm_clock_mhz")
            if isinstance(clock, (int, float)):
                s["sm_clock_mhz"] = int(round(clock * factor))
        temp, power = s.get("temperature_c"), s.get("power_w")
        if "hot" in spec and isinstance(temp, (int, float)):
            s["temperature_c"] = temp + spec["hot"]
        if "lowpower" in spec and isinstance(power, (int, float)):
            s["power_w"] = round(power * spec["lowpower"], 3)
        s["injected"] = True
        out.append(s)
    return out


def power_limit(ctx: Context, gpu: int, samples: "list[Sample]") -> tuple[float | None, str]:
    """Enforced power limit of `gpu`: the telemetry snapshot's power.limit_w, else a
    `power_limit_w` carried by the samples (replays, tests), else None."""
    for e in ctx.selected_gpu_entries():
        if e.get("index") == gpu:
            power = e.get("power")
            lim = power.get("limit_w") if power else None
            if isinstance(lim, (int, float)) and lim > 0:
                return float(lim), "nvmlDeviceGetEnforcedPowerLimit, telemetry snapshot"
    limits = (s.get("power_limit_w") for s in samples)
    vals = [float(v) for v in limits if isinstance(v, (int, float))]
    if vals:
        return statistics.median(vals), "power_limit_w in the samples"
    return None, "not in the telemetry snapshot"


# ---------------------------------------------------------------------------------------------
# the check


@define(
    CHECK_ID,
    title="Power and clock stability: sustained GEMM on every GPU, hardware slowdowns, power reach, hot GPUs",
    level=Level.EXTENDED,
    needs=(Need.TORCH, Need.GPU),
    budget_fn=_budget,
    detects="clocks cut by hardware under load (HW slowdown, HW thermal, power brake), GPUs that cannot reach "
            "their power limit, GPUs much hotter than their peers",
    defaults=DEFAULTS,
    limits=LIMITS,
    injects=_INJECTS,
    min_slice_fn=_min_slice,
    top_level=Level.BURN_IN,
    unavailable_fn=no_telemetry,
    options=PowerOptions,
)
def power_check(ctx: Context) -> list[Result]:
    p = _params(ctx)
    device = "cpu" if ctx.device == "cpu" else "cuda"
    why = no_telemetry(ctx)
    if why:
        return [Result(CHECK_ID, Status.SKIP, why)]
    nvml_telemetry = ctx.telemetry.kind == "live"
    if device == "cuda" and nvml_telemetry and ctx.snapshot is not None:
        nv = ctx.snapshot.get("nvml")
        if nv and nv.get("ok") is False:
            err = nv.get("error")
            kind, message = (err.get("kind", "unknown"), err.get("message", "")) if err else ("unknown", "")
            return [Result(CHECK_ID, Status.ERROR,
                           f"could not judge: NVML is not working ({kind}: "
                           f"{message}), so power, clocks and clock-event reasons cannot be read")]

    duration = power_duration(ctx, p)
    warmup = float(p["warmup_s"])
    notes: list[str] = []
    promise = _promise(ctx, p)
    problem = deadline_problem(ctx, CHECK_ID, promise)
    if problem is not None:
        return [problem]

    targets, results, guard = guarded_targets(ctx, device, CHECK_ID, "loaded")  # GPUs in use: skipped
    if not targets:
        return results or [Result(CHECK_ID, Status.SKIP, "no GPU selected to load")]

    size = int(ctx.options_for(PowerOptions).size or (p["cpu_size"] if device == "cpu" else p["size"]))
    # telemetry injections (injection_specs), applied to the samples when judging
    specs: dict[int, dict[str, Any]] = {}

    def inject(g: int) -> InjectionArgs:
        spec, texts, problem = injection_specs(ctx, g)
        if not problem:
            specs[g] = spec
        return {}, texts, problem

    first: dict[int, float] = {}
    last: dict[int, float] = {}

    def observe(job: "WorkerJob", info: "WorkerProgress") -> None:  # the burn worker's: BurnProgress
        now = time.time()
        g = job_gpu(job)
        first.setdefault(g, now)
        last[g] = now
        burn = cast("BurnProgress", info)
        burn["time_left_s"] = max(0.0, float(burn.get("time_left_s", 0.0)))

    def make_args(g: int) -> "BurnArgs":
        return {"duration_s": duration + warmup, "dtypes": [p["dtype"]], "size": size, "repeats": p["repeats"],
                "window_s": p["window_s"], "ref_rows": 8, "ref_every_s": p["ref_every_s"], "seed": 0,
                "distributions": ["normal"]}

    run: "PerGpuRun[BurnResult | SetupError, BurnProgress]" = run_per_gpu(
        ctx, CHECK_ID, "gpucheck.compute.gemm:burn_worker", targets, device=device, p=p,
        budget_s=duration + warmup + float(p["startup_timeout_s"]) + 30.0, make_args=make_args,
        injection_args=inject, observe=observe,
    )
    results.extend(run.results)
    if not run.jobs:
        return results
    jobs, outcomes, sampler, injected, elapsed = run.jobs, run.outcomes, run.sampler, run.injected, run.elapsed_s
    results.extend(_judge(ctx, p, device, jobs, outcomes, sampler, specs, injected, first, last, notes,
                          not nvml_telemetry, promise))
    for r in results:
        r.duration_s = elapsed
    return sorted(guard.annotate(results), key=lambda r: (r.gpu is None, r.gpu or 0))


def _sdc_detail(d: "BurnResult") -> str:
    evs = d.get("sdc") or []
    if not evs:
        return ""
    ev = evs[0]
    what = ("differ between two runs of the same operands" if ev.get("kind") == "repeat"
            else "off the float64 reference")
    return f"{ev.get('dtype')} set {ev.get('set')}: {ev.get('elements')} element(s) {what}"


def _judge(ctx: Context, p: PowerParams, device: str, jobs: "list[WorkerJob]",
           outcomes: "dict[str, WorkerOutcome[BurnResult | SetupError, BurnProgress]]", sampler: Any,
           specs: dict[int, dict[str, Any]], injected: dict[int, list[str]], first: dict[int, float],
           last: dict[int, float], notes: list[str], injected_telemetry: bool, promise: Promise | None = None
           ) -> list[Result]:
    out: list[Result] = []
    cut: dict[int, tuple[str, float | None]] = {}  # GPU -> (why it stopped, seconds loaded)
    loads: dict[int, PowerLoad] = {}
    warmup = float(p["warmup_s"])
    xid_watched = sampler.xid_note is None
    for j in jobs:
        g = job_gpu(j)
        oc = outcomes.get(j.worker_id)
        inj = injected.get(g, [])
        unfinished = unfinished_result(CHECK_ID, g, oc, inj, worker="load", setup_verb="load the GPU")
        if unfinished is not None or oc is None:
            out.append(unfinished or Result(CHECK_ID, Status.ERROR, "no outcome from the worker pool", gpu=g))
            continue
        d = returned_data(oc)
        if g not in first:
            skipped = "; ".join(f"{k}: {v}" for k, v in (d.get("skipped") or {}).items()) or "no GEMM window finished"
            out.append(Result(CHECK_ID, Status.ERROR, f"could not load the GPU: {skipped}", gpu=g, injected=inj))
            continue
        raw = load_window(sampler.samples(g), first[g] + warmup, last[g])
        samples = apply_injections(raw, specs.get(g, {}))
        limit, source = power_limit(ctx, g, samples)
        dtypes = d.get("dtypes")
        dt = next(iter(dtypes.values()), None) if dtypes else None
        tflops = dt.get("tflops") if dt else None
        config = d.get("config")
        size = (config.get("size") if config else None) or j.args.get("size")
        load = (f"load: {p['dtype']} GEMMs {size}x{size} on every selected GPU at once for "
                f"{float(d.get('seconds', 0.0)):.0f} s"
                + (f", median {tflops:.4g} TFLOP/s" if tflops else "")
                + f"; the first {warmup:g} s after the first GEMM window are warm-up and not judged")
        ev = list(notes)
        if device == "cpu":
            ev.append(f"CPU worker {g} standing in for a GPU; telemetry from {sampler.description}")
        if injected_telemetry and device != "cpu":
            ev.append(f"telemetry from {sampler.description}, not NVML")
        if specs.get(g):
            ev.append(f"telemetry of this GPU altered by injection: {', '.join(inj)}")
        if sampler.note and not raw:
            ev.append(sampler.note)
        if sampler.xid_note:
            ev.append(sampler.xid_note)
        if oc.kind in (CANCELLED, OVER_BUDGET) or d.get("stopped"):
            ev.append(f"stopped early ({d.get('stopped') or oc.kind}): the load window is partial")
            cut[g] = (str(d.get("stopped") or oc.kind), d.get("seconds"))
        loads[g] = {
            "samples": samples, "limit_w": limit, "limit_source": source, "injected": inj, "evidence": ev,
            "load": load, "sdc_events": int(d.get("sdc_count", 0)), "sdc_detail": _sdc_detail(d),
            "xid": [x["xid"] for x in sampler.xid_events(g)] if xid_watched else None,
        }
    judged = judge_power(loads, p)
    if promise is not None:
        for r in judged:
            if r.gpu in cut:
                cut_short(r, promise, cut[r.gpu][1], cut[r.gpu][0])
    out.extend(judged)
    return out


CHECKS = [power_check]
