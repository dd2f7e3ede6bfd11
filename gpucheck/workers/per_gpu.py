"""One worker per GPU for a compute check: the jobs, the NVML sampler beside them, live progress,
and the supervised run. Shared by burn.gemm, poet.ortho, eud.memtest and eud.power; each check
keeps its own arguments, injections and judging. Also the rules they share: `level_duration`
(how long a looping check runs), `promised` / `duration_slice` / `cut_short` (a run's time
limit never silently shortens what a level or --duration promised: the check is not started, or
its pass becomes an error naming what it was promised and what it got), `startup_floor_s` and
`stop_timings` / `pool_budget` (what is left of the run's time limit), and `unfinished_result`
(hang, crash, setup error, unfinished: the same verdicts everywhere).

    run = run_per_gpu(ctx, CHECK_ID, "gpucheck.compute.gemm:burn_worker", targets, device=device,
                      p=p, budget_s=..., make_args=lambda gpu: {...},
                      injection_args=lambda gpu: (extra_args, injection_texts, usage_problem_or_None))
    run.outcomes[job.worker_id], run.sampler, run.injected[gpu], run.results (usage errors)

A GPU whose injection is a usage problem gets an `error` result and no worker. The sampler samples
the run's telemetry source (`ctx.telemetry`) when it has telemetry for the workers' device (live
NVML: CUDA only; a fake source: whatever it was given). Cancelled workers are stopped
within 0.8 of the runner's stop time `ctx.stop_s` (5 s without a time limit: stop 1.5 s,
SIGTERM 1 s, SIGKILL 1.5 s).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generic, Mapping, TypedDict, TypeVar, cast

from ..core.check import Context, Slice
from ..core.options import flag_of
from ..core.inject import InjectionArgs
from ..core.result import Action, Basis, Result, Status, settle
from .results import P, R

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import TelemetrySummary
    from .pool import WorkerJob, WorkerOutcome
    from .results import SetupError, WorkerProgress
    from .sampler import Sampler
    from .targets import WorkerTarget

# CPU time a fresh interpreter spends importing torch, as a lower bound: 2.13's CPU build took
# 0.99 to 1.7 s on a 2-core EPYC VM (benchmarks/RESULTS.md, "Level 1"). Every worker imports it
# before its first heartbeat; a CUDA build and the CUDA context only add to this.
TORCH_IMPORT_CPU_S = 0.9

# Telemetry merged into each progress report for the live display.
DISPLAY_TELEMETRY = ("temperature_c", "sm_clock_mhz", "power_w")


class PoolParams(TypedDict):
    """The parameters of a check's worker pool (run_per_gpu): every check that runs one declares them."""

    sample_interval_s: float  # NVML sampling period
    heartbeat_timeout_s: float  # a worker silent this long is hung
    startup_timeout_s: float  # spawn + imports + device init


class LevelDurations(TypedDict, total=False):
    """How long a looping check runs at each level (level_duration): the levels it runs at."""

    duration_s_level2: float
    duration_s_level3: float
    duration_s_level4: float


class LoadParams(PoolParams, LevelDurations):
    """A check that loads every GPU for its level's duration (LoadTime)."""


LP = TypeVar("LP", bound=LoadParams)  # a LoadTime check's own parameters
A = TypeVar("A", bound=Mapping[str, object])  # a worker target's arguments
RD = TypeVar("RD", bound=Mapping[str, Any])  # a worker target's data (its result, but SetupError)


@dataclass
class PerGpuRun(Generic[R, P]):
    """A run of one worker per GPU; R and P are the target's result and progress report types
    (gpucheck.workers.results), named by the check: `run: PerGpuRun[BurnResult | SetupError,
    BurnProgress] = run_per_gpu(...)`."""

    jobs: "list[WorkerJob]" = field(default_factory=list)
    outcomes: "dict[str, WorkerOutcome[R, P]]" = field(default_factory=dict)  # by worker_id
    sampler: "Sampler | None" = None
    injected: dict[int, list[str]] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)  # injection usage errors
    elapsed_s: float = 0.0


def run_per_gpu(
    ctx: Context,
    check_id: str,
    worker_ref: str,
    targets: "list[WorkerTarget]",
    *,
    device: str,
    p: PoolParams,
    budget_s: float,
    make_args: Callable[[int], A],
    injection_args: Callable[[int], InjectionArgs],
    hide_progress_keys: tuple[str, ...] = (),
    observe: "Callable[[WorkerJob, WorkerProgress], None] | None" = None,
) -> PerGpuRun[Any, Any]:
    """Start one worker per target (see workers.targets.worker_targets), sample NVML meanwhile,
    wait for all of them. `p` supplies sample_interval_s, heartbeat_timeout_s, startup_timeout_s.
    `observe(job, info)` sees (and may amend) every progress report before the display does."""
    from .pool import WorkerJob, run_workers
    from .sampler import Sampler

    run: PerGpuRun[Any, Any] = PerGpuRun()
    for t in targets:
        g = t["gpu"]
        extra, texts, problem = injection_args(g)
        run.injected[g] = texts
        if problem:
            run.results.append(Result(check_id, Status.ERROR, problem, gpu=g, injected=texts))
            continue
        run.jobs.append(WorkerJob(f"gpu{g}", gpu=g, device=device, args={**make_args(g), **extra},
                                  visible_device=t["visible"] if device == "cuda" else None))
    if not run.jobs:
        return run

    if ctx.telemetry.watches(device):
        run.sampler = Sampler([j.gpu for j in run.jobs if j.gpu is not None], source=ctx.telemetry,
                              interval_s=float(p["sample_interval_s"]))

    def on_progress(job: "WorkerJob", info: "WorkerProgress") -> None:
        if observe is not None:
            observe(job, info)
        merged: dict[str, object] = {k: v for k, v in info.items() if k not in hide_progress_keys}
        latest = run.sampler.latest(job.gpu) if run.sampler is not None and job.gpu is not None else None
        for key in DISPLAY_TELEMETRY:
            value = latest.get(key) if latest is not None else None
            if value is not None:
                merged[key] = value
        ctx.report(check_id, f"gpu{job.gpu}", merged)

    t0 = time.monotonic()
    run.outcomes = run_workers(
        worker_ref,
        run.jobs,
        budget_s=pool_budget(ctx, budget_s),
        heartbeat_timeout_s=float(p["heartbeat_timeout_s"]),
        startup_timeout_s=float(p["startup_timeout_s"]),
        cancel=ctx.cancel,
        on_progress=on_progress,
        sampler=run.sampler,
        **stop_timings(ctx),
    )
    run.elapsed_s = time.monotonic() - t0
    return run


def level_duration(ctx: Context, p: LevelDurations, given: float | None = None, *, lowest: int = 2,
                   highest: int = 4) -> float:
    """A looping check's length: `given` (its duration option, `--duration`) when given, else the
    check's `duration_s_level<N>` default for the run's level clamped to [lowest, highest]."""
    if given is not None:
        return float(given)
    level = max(lowest, min(highest, int(ctx.level)))
    by_level = {2: p.get("duration_s_level2"), 3: p.get("duration_s_level3"), 4: p.get("duration_s_level4")}
    seconds = by_level.get(level)
    if seconds is None:
        raise KeyError(f"duration_s_level{level}")
    return float(seconds)


def worker_count(ctx: Context) -> int:
    """How many workers a compute check starts on this run (CPU workers, or usable GPUs)."""
    if ctx.device == "cpu":
        return len([i for i in range(ctx.workers) if ctx.gpus is None or i in ctx.gpus])
    return len([g for g in ctx.selected_gpu_entries() if g.get("state", "ok") == "ok"]) or 1


def startup_floor_s(ctx: Context, import_cpu_s: float = TORCH_IMPORT_CPU_S) -> float:
    """A lower bound of the time from spawning the workers to their first heartbeat: each spends
    `import_cpu_s` of CPU time importing its backend, and they share the cores this process may
    run on."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return import_cpu_s * max(1.0, worker_count(ctx) / max(1, cores))


def stop_timings(ctx: Context) -> dict[str, float]:
    """run_workers' stop sequence (ask, SIGTERM, SIGKILL) inside 0.8 of the runner's stop time."""
    g = float(ctx.stop_s)
    return {"stop_grace_s": 0.3 * g, "term_grace_s": 0.2 * g, "kill_wait_s": 0.3 * g,
            "poll_s": min(0.1, max(0.02, g / 20))}


def pool_budget(ctx: Context, budget_s: float) -> float:
    """A pool's budget, never past the run's deadline (the runner cancels there anyway)."""
    if ctx.deadline is None:
        return budget_s
    return max(0.0, min(budget_s, ctx.deadline - time.monotonic()))


@dataclass(frozen=True)
class Promise:
    """How long a looping check was asked to run, and who asked: the level's default, or the
    user (`--duration`). A run's time limit never shortens it."""

    seconds: float  # 0 for a promise of work rather than time (memtest passes)
    source: str  # "--duration" or "the level-N default"
    what: str  # "burn", "load", "2 pass(es) of 10 pattern(s)", ...

    def describe(self) -> str:
        return f"{self.seconds:g} s of {self.what} ({self.source})" if self.seconds else f"{self.what} ({self.source})"


def promised(ctx: Context, p: LevelDurations, what: str, given: float | None = None, *, flag: str = "--duration",
             lowest: int = 2, highest: int = 4, extra_s: float = 0.0) -> Promise:
    """The Promise of a looping check: level_duration (plus `extra_s`, a warm-up) and its source:
    `flag`, the option that gave the duration (`given`), or the level's default."""
    lv = max(lowest, min(highest, int(ctx.level)))
    source = flag if given is not None else f"the level-{lv} default"
    return Promise(level_duration(ctx, p, given, lowest=lowest, highest=highest) + extra_s, source, what)


def duration_slice(ctx: Context, promise: Promise | None, import_cpu_s: float = TORCH_IMPORT_CPU_S) -> Slice:
    """The least time a looping check needs: its workers' start-up floor, then the promise."""
    floor = startup_floor_s(ctx, import_cpu_s)
    if promise is None:
        return Slice(floor, f"at least {floor:.1f} s to start {worker_count(ctx)} worker(s)")
    return Slice(floor + promise.seconds, f"{promise.describe()} after at least {floor:.1f} s to start "
                                          f"{worker_count(ctx)} worker(s)")


def deadline_problem(ctx: Context, check_id: str, promise: Promise, import_cpu_s: float = TORCH_IMPORT_CPU_S
                     ) -> Result | None:
    """An error when the run's time limit cannot hold the promise (the runner does not start such
    a check; this guards direct callers), else None."""
    if ctx.deadline is None:
        return None
    need = duration_slice(ctx, promise, import_cpu_s)
    left = ctx.deadline - time.monotonic()
    if left >= need.seconds:
        return None
    return Result(check_id, Status.ERROR, f"not run: the run's time limit leaves {max(0.0, left):.1f} s and "
                                          f"{check_id} needs at least {need.seconds:.1f} s ({need.what})")


def cut_short(r: Result, promise: Promise, ran_s: float | None, why: str) -> Result:
    """A result whose run was stopped before it kept its promise: a pass, warn or skip becomes an
    error naming what was promised and what it got (partial data never passes); a fail stands
    (the fault was seen). The earlier summary moves to the evidence."""
    got = "an unknown time" if ran_s is None else f"{ran_s:.1f} s"
    r.unjudged["the promised run"] = Status.ERROR  # result.outcome: an error unless a fail was found
    if r.status in (Status.PASS, Status.WARN, Status.SKIP):
        r.evidence.insert(0, f"before the stop: {r.status.value}: {r.summary}")
        r.summary = f"cut short: {promise.describe()} promised, stopped ({why}) after {got}"
        if r.basis is None:
            settle(r)
        else:
            r.status, r.action = Status.ERROR, Action.NONE
    else:
        r.evidence.append(f"cut short: {promise.describe()} promised, stopped ({why}) after {got}")
    if promise.seconds:
        r.metric("promised_s", round(promise.seconds, 3), "s")
    if ran_s is not None:
        r.metric("ran_s", round(float(ran_s), 3), "s")
    return r


def stopped_early(r: Result, oc: "WorkerOutcome[Any, Any]", promise: Promise) -> Result:
    """A worker that returned data but was stopped (cancelled, over budget, or it said it
    stopped): the evidence says after how long, and the result is cut short (cut_short)."""
    from .pool import CANCELLED, OVER_BUDGET

    if oc.result is None:  # no data: unfinished_result judged it
        return r
    if oc.kind in (CANCELLED, OVER_BUDGET) or oc.result.get("stopped"):
        stopped = oc.result.get("stopped") or oc.kind
        r.evidence.append(f"stopped early ({stopped}) after {oc.result.get('seconds', 0):.1f} s "
                          f"of {promise.seconds:.0f} s: results are partial")
        cut_short(r, promise, oc.result.get("seconds"), stopped)
    return r


def progress_evidence(progress: "WorkerProgress", leave_out: tuple[str, ...] = ()) -> str:
    """A worker's last progress report as one evidence line (floats to 4 significant digits)."""
    return "last progress: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in progress.items() if k not in leave_out)


def telemetry_summary(sampler: "Sampler | None", gpu: int, device: str) -> "TelemetrySummary":
    """The sampler's summary of one GPU (workers.sampler.summarize), with why Xid events were not
    watched; without a sampler, an empty summary that says why there is no telemetry."""
    from .sampler import summarize

    if sampler is None:
        return summarize([], note="no NVML telemetry: CPU workers stand in for GPUs" if device == "cpu"
                         else "no NVML telemetry")
    s = sampler.summary(gpu)
    if sampler.xid_note:
        s["xid_note"] = sampler.xid_note
    return s


def add_telemetry(r: Result, t: "TelemetrySummary") -> None:
    """A GPU's telemetry summary as metrics (clocks, temperature, power) and evidence lines."""
    if t["samples"]:
        r.metric("sm_clock_min_mhz", t["sm_clock_min_mhz"], "MHz")
        r.metric("sm_clock_median_mhz", t["sm_clock_median_mhz"], "MHz")
        r.metric("sm_clock_max_mhz", t["sm_clock_max_mhz"], "MHz")
        r.metric("temperature_max_c", t["temperature_max_c"], "C")
        r.metric("power_mean_w", t["power_mean_w"], "W")
        r.evidence.append(f"telemetry: {t['samples']} samples; throttle reasons seen: "
                          + (", ".join(t["throttle_reasons"]) or "none"))
        if t["errors"]:
            r.evidence.append("NVML errors while sampling: " + ", ".join(t["errors"]))
    else:
        note = t.get("note")
        if note:
            r.evidence.append(note)
    xid_note = t.get("xid_note")
    if xid_note:
        r.evidence.append(xid_note)


def finish_result(r: Result, t: "TelemetrySummary", *, device: str, gpu: int, notes: list[str],
                  elapsed_s: float) -> Result:
    """What every per-GPU result of a worker check carries besides its verdict: the telemetry, a
    note when a CPU worker stood in for the GPU, the run's notes and the time it took."""
    add_telemetry(r, t)
    if device == "cpu":
        r.evidence.append(f"CPU worker {gpu} standing in for a GPU")
    r.evidence.extend(notes)
    r.duration_s = elapsed_s
    return r


def job_gpu(job: "WorkerJob") -> int:
    """The GPU a job of run_per_gpu stands for (it starts one per GPU: every job names its GPU)."""
    if job.gpu is None:
        raise ValueError(f"worker {job.worker_id} names no GPU")
    return job.gpu


def worker_data(oc: "WorkerOutcome[RD | SetupError, Any] | None") -> RD | None:
    """The data a worker returned (possibly partial, after a stop), or None: no outcome, no
    result, or a setup error (not data: unfinished_result judges it)."""
    if oc is None or oc.result is None or oc.result.get("setup_error"):
        return None
    return cast(RD, oc.result)


def returned_data(oc: "WorkerOutcome[RD | SetupError, Any] | None") -> RD:
    """The data of an outcome that unfinished_result left to the check's judge (it returned None:
    the worker returned data); ValueError for one it judges itself."""
    data = worker_data(oc)
    if data is None:
        raise ValueError("no worker data to judge: unfinished_result judges this outcome")
    return data


def _cuda_crash(err: str) -> tuple[str, Action]:
    low = err.lower()
    return "", (Action.RESET_GPU if ("cuda" in low or "cublas" in low) else Action.INVESTIGATE)


def unfinished_result(
    check_id: str,
    gpu: int,
    oc: "WorkerOutcome[Any, P] | None",
    injected: list[str],
    *,
    worker: str,
    setup_verb: str,
    partial: Callable[[Result, P], None] | None = None,
    crash: Callable[[str], tuple[str, Action]] | None = None,
) -> Result | None:
    """The result for a worker outcome with no data to judge, or None when it returned data
    (possibly partial, after a stop). The same rules for every per-GPU check:

    - no outcome: error; setup error: error "could not <setup_verb>: ..." (not a hardware verdict);
    - hung: fail "hang: the <worker> worker stopped answering" (reset-gpu);
    - crashed: fail "<worker> worker crashed: <error>" (reset-gpu when CUDA or cuBLAS named it,
      else investigate), the traceback's last lines as evidence; `crash(error)` may supply its own
      (summary, action) (an ECC error in a memory test);
    - no result (cancelled, over budget): error "not finished".

    `partial(result, last_progress)` adds what the worker reported before it stopped."""
    from .pool import CANCELLED, CRASHED, HUNG

    if oc is None:
        return Result(check_id, Status.ERROR, "no outcome from the worker pool", gpu=gpu, injected=injected)
    if oc.kind == HUNG:
        r = Result(check_id, Status.FAIL, f"hang: the {worker} worker stopped answering and was killed "
                                          f"({oc.error}); a GPU that hangs a kernel is unhealthy",
                   gpu=gpu, action=Action.RESET_GPU, injected=injected, basis=Basis.HANG)
    elif oc.kind == CRASHED:
        err = oc.error or "unknown error"
        summary, action = (crash or _cuda_crash)(err)
        r = Result(check_id, Status.FAIL, summary or f"{worker} worker crashed: {err}", gpu=gpu, action=action,
                   injected=injected, basis=Basis.CRASH)
        if oc.traceback:
            r.evidence.extend(oc.traceback.strip().splitlines()[-12:])
    elif oc.result is not None and oc.result.get("setup_error"):
        return Result(check_id, Status.ERROR, f"could not {setup_verb}: {oc.result['setup_error']}", gpu=gpu,
                      injected=injected)
    elif oc.result is None:
        why = ("interrupted before the worker returned" if oc.kind == CANCELLED
               else f"the worker overran its time budget ({oc.error})")
        r = Result(check_id, Status.ERROR, f"not finished: {why}", gpu=gpu, injected=injected)
    else:
        return None
    if partial is not None and oc.progress:  # what the worker reported before it stopped
        partial(r, oc.progress)
    return r


@dataclass(frozen=True)
class LoadTime(Generic[LP]):
    """The time functions of a check that loads every GPU for its level's duration (`burn.gemm`,
    `poet.ortho`): its parameters, how long it loads, its budget (that plus the workers' start-up
    timeout and 30 s), the Promise it makes, and the least slice of a run's time it needs."""

    check_id: str
    defaults: LP
    what: str  # what is promised, as the Promise names it ("burn", "POET problems")
    options: type  # the check's options dataclass (gpucheck.core.options): its `duration_s` is the duration

    def __post_init__(self) -> None:
        flag_of(self.options, "duration_s")  # TypeError: no duration option to read

    def given_s(self, ctx: Context) -> float | None:
        """The duration the command gave (`--duration`), or None: the level's default."""
        given: float | None = getattr(ctx.options_for(self.options), "duration_s")
        return given

    def params(self, ctx: Context) -> LP:
        return ctx.params(self.check_id, self.defaults)

    def duration(self, ctx: Context, p: LP | None = None) -> float:
        return level_duration(ctx, p or self.params(ctx), self.given_s(ctx))

    def budget(self, ctx: Context) -> float:
        p = self.params(ctx)
        return self.pool_budget_s(p, self.duration(ctx, p))

    @staticmethod
    def pool_budget_s(p: PoolParams, duration_s: float) -> float:
        """The workers' budget for a load of `duration_s`: that plus their start-up timeout and 30 s."""
        return duration_s + float(p["startup_timeout_s"]) + 30.0

    def start(self, ctx: Context) -> tuple[LP, Promise, Result | None]:
        """The check's prologue: its parameters, the Promise its run makes, and the error Result
        when what is left of the run's time cannot keep it (deadline_problem), else None."""
        p = self.params(ctx)
        promise = self.promise(ctx, p)
        return p, promise, deadline_problem(ctx, self.check_id, promise)

    def promise(self, ctx: Context, p: LP | None = None) -> Promise:
        return promised(ctx, p or self.params(ctx), self.what, self.given_s(ctx),
                        flag=flag_of(self.options, "duration_s"))

    def min_slice(self, ctx: Context) -> Slice:
        """The workers' start-up floor and the whole promised run: a shorter one is no level-N run."""
        return duration_slice(ctx, self.promise(ctx))
