"""eud.memtest: the HBM pattern test on every GPU at once.

One worker process per GPU (gpucheck.workers.pool) runs gpucheck.eud.memtest_worker: CUDA kernels
through CuPy that fill and verify device memory with the classic patterns (zeros, ones, walking
ones and zeros, checkerboard and its inverse, address-in-address, seeded random, moving
inversions; definitions in gpucheck.eud.patterns). Level 2 tests `fraction_level2` (10 %) of the
free memory once, level 3 nearly all free memory (minus headroom) in two passes, level 4 loops
over it for the burn-in duration. `--device cpu --workers N` runs the same patterns in NumPy on
CPU workers standing in for GPUs.

Per GPU one result:

- fail "memory errors: N in <bytes> tested" when any word read back differs from what was
  written, with the first errors (byte offset, expected and actual words, flipped bits), the bit
  histogram (0->1 and 1->0 per bit) and whether the errors reproduced. Action: rma when the fault
  is persistent (the same word failed in two verify runs: a confirmation rerun of the pattern, a
  later pass, or another pattern) or recurring (two or more verify runs found errors, at different
  words), drain when a single verify run saw errors and its rerun was clean (re-test after a reset);
- fail when the worker hung (reset-gpu) or crashed (an uncorrectable ECC error while testing:
  reset-gpu, the row is remapped at the reset; see the memory-remap check);
- error when gpucheck could not judge (no CuPy, no memory could be allocated, interrupted before
  anything was verified);
- pass otherwise, with the bandwidth of the test (bytes written plus read per second) and its
  ratio to a device-to-device copy measured in the same run. The ratio is reported, not judged:
  both numbers come from the same HBM, so a slow HBM lowers both alike and the ratio only says how
  efficient gpucheck's kernels are on this GPU model (a benchmark goal, >= 0.8); HBM speed itself
  is judged by eud.bandwidth.

Options (MemtestOptions, `gpucheck eud --memtest-fraction/--pattern/--duration`): fraction (0 < f
<= 1 of the free memory), patterns (list or comma string), duration_s (loop for this long; level
4's default is duration_s_level4).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, cast

from ..eud.memtest_ecc import COUNTER_OF, ECC_RULES, EccLimitParams, ecc_limits, growth, inject_spec
from ..eud.patterns import NAMES, PatternError, describe_error, histogram_text, human_bytes, parse_patterns
from ..platform.durations import parse_duration
from ..sdk import (Action, Context, InjectionArgs, Key, Level, Limit, Need, Result, Rule, Slice, Status, compute_skip,
                   define, evaluate, flag_of, injections_for_gpu, option, settle)
from ..sdk.workers import (CANCELLED, OVER_BUDGET, MemtestErrors, PoolParams, Promise, cut_short, deadline_problem, duration_slice,
                           guarded_targets, job_gpu, progress_evidence, returned_data, run_per_gpu, telemetry_summary,
                           unfinished_result)

if TYPE_CHECKING:  # pragma: no cover
    from ..eud.memtest_worker import MemtestArgs
    from ..platform.telemetry.model import TelemetrySummary
    from ..sdk.workers import (MemtestCopy, MemtestProgress, MemtestResult, MemtestStall,
                               PerGpuRun, SetupError, WorkerOutcome)

CHECK_ID = "eud.memtest"


class MemtestParams(PoolParams, EccLimitParams):
    """eud.memtest's parameters (DEFAULTS, merged with the config's [checks."eud.memtest"])."""

    fraction_level2: float
    fraction_level3: float
    fraction_level4: float
    headroom_fraction: float
    headroom_min_bytes: int
    chunk_bytes: int
    passes_level2: int
    passes_level3: int
    duration_s_level4: float
    patterns: list[str]
    seed: int
    max_errors: int
    report_errors: int
    confirm: bool
    copy_bytes: int
    copy_repeats: int
    cpu_bytes: int
    cpu_chunk_bytes: int
    block: int
    blocks_per_sm: int
    headroom_round_level3: bool
    headroom_round_level4: bool
    round2_reserve_bytes: int
    pass_budget_s: float
    stall_timeout_s: float


class MemtestPlan(TypedDict):
    """What this run tests (plan): the options over the level's defaults."""

    fraction: float
    duration_s: float | None  # a loop over the patterns this long; None: `passes`
    passes: int
    patterns: list[str]
    headroom_round: bool


class ErrorsView(MemtestErrors):
    """Both rounds' error summaries as one (_errors_view): MemtestErrors, and the headroom round's count."""

    headroom_errors: int


# A metric of the pattern test: a count, a rate, an offset (None: none), or per-bit flip counts.
_Metric = int | float | dict[str, int] | None

DEFAULTS: MemtestParams = {
    "fraction_level2": 0.1,  # of the free GPU memory
    "fraction_level3": 1.0,  # nearly all of it: the headroom below is kept free
    "fraction_level4": 1.0,
    "headroom_fraction": 0.05,  # keep max(this x total, headroom_min_bytes) free for the driver and others
    "headroom_min_bytes": 1 << 30,
    "chunk_bytes": 1 << 30,  # allocation unit
    "passes_level2": 1,
    "passes_level3": 2,
    "duration_s_level4": 3600.0,  # level 4 loops over the patterns this long
    "patterns": list(NAMES),
    "seed": 0,
    "max_errors": 32,  # error records kept per verify step (all errors are counted)
    "report_errors": 8,  # error records in the result
    "confirm": True,  # rerun a pattern that found errors once, to tell persistent from transient
    "copy_bytes": 1 << 30,  # device-to-device copy baseline: bytes per copy
    "copy_repeats": 10,
    "cpu_bytes": 16 << 20,  # --device cpu: host memory per worker
    "cpu_chunk_bytes": 8 << 20,
    "block": 256,  # threads per block
    "blocks_per_sm": 32,  # cap on the occupancy API's blocks per SM (the grid is one wave either way)
    "headroom_round_level3": True,  # after the passes, test the headroom in a second allocation round
    "headroom_round_level4": True,
    "round2_reserve_bytes": 256 << 20,  # memory left free during that round
    "ecc_corrected_growth_max": 0,  # fail when volatile corrected ECC errors grow by more during the test
    "ecc_uncorrected_growth_max": 0,  # ... uncorrected ECC errors
    "remapped_rows_growth_max": 0,  # ... remapped rows (corrected or uncorrectable)
    "pass_budget_s": 120.0,  # time budget per pass (an H100 pass over 75 GB takes about a second)
    "stall_timeout_s": 60.0,  # a step of kernels still running this long is a hang (heartbeats stop)
    "heartbeat_timeout_s": 60.0,  # a worker silent this long is hung
    "startup_timeout_s": 120.0,  # spawn + CuPy import + kernel compile + CUDA init
    "sample_interval_s": 1.0,  # NVML sampling period (Xid events during the test)
}
# What a setting may be where gpucheck.core.config.conventional_limit is not enough: sizes and counts
# of work are at least 1 (0 would examine nothing).
LIMITS = {
    **{k: Limit("int", 1) for k in ("passes_level2", "passes_level3", "max_errors", "copy_bytes",
                                     "copy_repeats", "cpu_bytes", "cpu_chunk_bytes", "blocks_per_sm")},
    "chunk_bytes": Limit("int", 64, 16 << 30),  # the kernels' offsets within a chunk are 32-bit
    "block": Limit("int", 1, 1024),
    **{f"fraction_level{n}": Limit("real", 0, 1, above=True) for n in (2, 3, 4)},  # of the free memory
}

_LEVELS = (2, 3, 4)


@dataclass(frozen=True)
class MemtestOptions:
    """`gpucheck eud`'s memtest options (None: not given, the level's default or the config's applies)."""

    fraction: float | None = option(
        "--memtest-fraction", "real", low=0.0, low_open=True, high=1.0,
        help="Fraction of each GPU's free memory the pattern test covers (default by level).")
    patterns: Sequence[str] | str | None = option(
        "--pattern", "list", metavar="NAME", parse=parse_patterns, error=PatternError,
        help="Memtest patterns to run (comma list; default all; see docs/eud.md).")
    duration_s: float | None = option(
        "--duration", parse=parse_duration,
        help="How long the memtest loops over its patterns (30s, 5m, 1h; default: 1 h at level 4; "
             "given at level 2 or 3 it replaces the fixed passes).")


def _params(ctx: Context) -> MemtestParams:
    return ctx.params(CHECK_ID, DEFAULTS)


def _level(ctx: Context) -> int:
    return max(_LEVELS[0], min(_LEVELS[-1], int(ctx.level)))


def _device(ctx: Context) -> str:
    return "cpu" if ctx.device == "cpu" else "cuda"


def plan(ctx: Context, p: MemtestParams | None = None) -> MemtestPlan:
    """Fraction, passes, loop duration and patterns of this run (options over level defaults).
    Raises ValueError / PatternError for bad options."""
    p = p or _params(ctx)
    lv = _level(ctx)
    given = ctx.options_for(MemtestOptions)
    by_level = {2: p["fraction_level2"], 3: p["fraction_level3"], 4: p["fraction_level4"]}
    frac = float(given.fraction) if given.fraction is not None else float(by_level[lv])
    if not 0.0 < frac <= 1.0:
        raise ValueError(f"memtest_fraction must be in (0, 1], not {frac}")
    duration = given.duration_s
    if duration is None and lv == 4:
        duration = p["duration_s_level4"]
    duration = None if duration is None else float(duration)
    passes = 1 if lv == 4 else int(p["passes_level2"] if lv == 2 else p["passes_level3"])
    patterns = parse_patterns(given.patterns or p["patterns"])
    headroom = bool({2: False, 3: p["headroom_round_level3"], 4: p["headroom_round_level4"]}[lv])
    return {"fraction": frac, "duration_s": duration, "passes": passes, "patterns": patterns,
            "headroom_round": headroom}


def _work_s(pl: MemtestPlan, p: MemtestParams) -> float:
    """The pattern work's time budget: the passes (or the loop and its last pass), and one more
    pass for the headroom round."""
    per_pass = float(p["pass_budget_s"])
    work = (pl["duration_s"] + per_pass) if pl["duration_s"] is not None else pl["passes"] * per_pass
    return work + (per_pass if pl["headroom_round"] else 0.0)


def _budget(ctx: Context) -> float:
    p = _params(ctx)
    try:
        pl = plan(ctx, p)
    except ValueError:
        return float(p["startup_timeout_s"]) + 30.0
    return float(p["startup_timeout_s"]) + _work_s(pl, p) + 30.0


def _promise(ctx: Context, p: MemtestParams, pl: MemtestPlan) -> Promise:
    """What this run promised: the pattern loop's duration, or its passes over the patterns."""
    given = ctx.options_for(MemtestOptions)
    if pl["duration_s"] is not None:
        return Promise(float(pl["duration_s"]), flag_of(MemtestOptions, "duration_s") if given.duration_s is not None
                       else f"the level-{_level(ctx)} default", "pattern loop")
    source = f"the level-{_level(ctx)} default" if given.patterns is None else flag_of(MemtestOptions, "patterns")
    return Promise(0.0, source, f"{pl['passes']} pass(es) of {len(pl['patterns'])} pattern(s)")


def _min_slice(ctx: Context) -> Any:
    """The promised pattern loop, if any (no start-up floor: NumPy or CuPy, not torch)."""
    p = _params(ctx)
    try:
        pl = plan(ctx, p)
    except (ValueError, PatternError):
        return Slice(0.0, "bad options: judged by the check")
    promise = _promise(ctx, p, pl)
    return duration_slice(ctx, promise if promise.seconds else None, import_cpu_s=0.0)


def injection_args(ctx: Context, gpu: int, patterns: list[str]) -> InjectionArgs:
    """`--inject bitflip:...` and `--inject ecc:...` for `gpu`: worker args, the injection texts,
    and a usage problem."""
    def bitflip(inj: Any, spec: dict[str, Any]) -> None:  # the last one for the GPU wins
        spec.clear()
        spec.update(_bitflip_spec(inj, patterns))

    def ecc_counts(inj: Any, spec: dict[str, Any]) -> None:  # the last one for the GPU wins
        spec.clear()
        spec.update(inject_spec(dict(inj.params)))

    flip, texts, problem = injections_for_gpu(ctx.injections, gpu, ("bitflip",), bitflip)
    if problem:
        return {}, texts, problem
    ecc, ecc_texts, problem = injections_for_gpu(ctx.injections, gpu, ("ecc",), ecc_counts)
    if problem:
        return {}, texts + ecc_texts, problem
    return {"inject": flip or None, "ecc_inject": ecc or None}, texts + ecc_texts, None


def _bitflip_spec(inj: Any, patterns: list[str]) -> dict[str, Any]:
    """`--inject bitflip:gpu=N[,offset=BYTES][,bit=B][,pattern=NAME][,sticky=1]`; ValueError."""
    bit = int(inj.get("bit", 17))
    offset = inj.get("offset")
    offset = None if offset is None else int(offset)
    pattern = inj.get("pattern")
    pattern = None if pattern is None else parse_patterns(str(pattern))[0]
    if not 0 <= bit < 64:
        raise ValueError(f"bit must be in 0..63, not {bit}")
    if offset is not None and offset < 0:
        raise ValueError(f"offset must be >= 0, not {offset}")
    if pattern is not None and pattern not in patterns:
        raise ValueError(f"pattern {pattern} is not run (patterns: {', '.join(patterns)})")
    return {"bit": bit, "offset": offset, "pattern": pattern, "sticky": bool(int(inj.get("sticky", 0) or 0))}


@define(
    CHECK_ID,
    title="HBM pattern test: fill and verify GPU memory with classic patterns (CuPy kernels)",
    level=Level.STANDARD,
    needs=(Need.GPU, Need.CUPY),
    budget_s=270.0,  # shown by `gpucheck list`: level 2 (startup + one pass + slack); runs use budget_fn
    budget_fn=_budget,
    detects="HBM cells, rows and address faults that return wrong data (stuck, coupled, weak bits)",
    defaults=DEFAULTS,
    limits=LIMITS,
    injects=("bitflip", "ecc"),
    min_slice_fn=_min_slice,
    top_level=Level.BURN_IN,
    options=MemtestOptions,
)
def memtest(ctx: Context) -> list[Result]:
    p = _params(ctx)
    device = _device(ctx)
    try:
        pl = plan(ctx, p)
    except (ValueError, PatternError) as e:
        return [Result(CHECK_ID, Status.ERROR, f"bad memtest options: {e}")]
    if device == "cuda" and importlib.util.find_spec("cupy") is None:
        return [compute_skip(ctx, CHECK_ID, "CuPy not installed (pip install 'gpucheck-cluster[cupy]'; "
                                            "or --device cpu for the NumPy path)")]
    notes: list[str] = []
    duration = pl["duration_s"]
    promise = _promise(ctx, p, pl)
    problem = deadline_problem(ctx, CHECK_ID, promise, import_cpu_s=0.0) if promise.seconds else None
    if problem is not None:
        return [problem]
    targets, results, guard = guarded_targets(ctx, device, CHECK_ID, "tested")  # GPUs in use: skipped
    if not targets:
        return results or [Result(CHECK_ID, Status.SKIP, "no GPU selected to test")]

    work = _work_s({**pl, "duration_s": duration}, p)

    def make_args(g: int) -> "MemtestArgs":
        return {"patterns": pl["patterns"], "passes": pl["passes"], "duration_s": duration,
                "fraction": pl["fraction"], "headroom_round": pl["headroom_round"], "seed": p["seed"],
                "headroom_fraction": p["headroom_fraction"], "headroom_min_bytes": p["headroom_min_bytes"],
                "chunk_bytes": p["chunk_bytes"], "max_errors": p["max_errors"], "report_errors": p["report_errors"],
                "confirm": p["confirm"], "copy_bytes": p["copy_bytes"], "copy_repeats": p["copy_repeats"],
                "cpu_bytes": p["cpu_bytes"], "cpu_chunk_bytes": p["cpu_chunk_bytes"], "block": p["block"],
                "blocks_per_sm": p["blocks_per_sm"], "round2_reserve_bytes": p["round2_reserve_bytes"],
                "stall_timeout_s": p["stall_timeout_s"]}

    run: "PerGpuRun[MemtestResult | SetupError, MemtestProgress | MemtestStall]" = run_per_gpu(
        ctx, CHECK_ID, "gpucheck.eud.memtest_worker:memtest_worker", targets, device=device, p=p,
        budget_s=work + float(p["startup_timeout_s"]) + 30.0, make_args=make_args,
        injection_args=lambda g: injection_args(ctx, g, pl["patterns"]), hide_progress_keys=("first_error",),
    )
    results.extend(run.results)
    if not run.jobs:
        return results
    jobs, outcomes, sampler, injected, elapsed = run.jobs, run.outcomes, run.sampler, run.injected, run.elapsed_s
    ecc = {int(e["index"]): (e.get("ecc_mode") or {}).get("current") for e in ctx.selected_gpu_entries()
           if e.get("index") is not None}
    for j in jobs:
        g = job_gpu(j)
        tel = telemetry_summary(sampler, g, device) if sampler is not None else None
        r = judge_outcome(g, outcomes.get(j.worker_id), p, device, injected.get(g, []),
                          ecc_enabled=ecc.get(g), telemetry=tel, promise=promise)
        r.evidence.extend(notes)
        r.duration_s = elapsed
        results.append(r)
    return sorted(guard.annotate(results), key=lambda r: (r.gpu is None, r.gpu or 0))


# ---------------------------------------------------------------------------------------------
# judging (pure)


def _crash(err: str) -> tuple[str, Action]:
    """A crashed pattern-test worker: an uncorrectable ECC error is named as such."""
    low = err.lower()
    if "ecc" in low:
        return (f"uncorrectable ECC error during the pattern test: {err} (the row is remapped at the next GPU "
                "reset; see the ecc and memory-remap checks)", Action.RESET_GPU)
    return "", Action.RESET_GPU if ("cuda" in low or "kernel" in low) else Action.INVESTIGATE


def judge_outcome(gpu: int, oc: "WorkerOutcome[MemtestResult | SetupError, MemtestProgress | MemtestStall] | None",
                  p: MemtestParams, device: str, injected: list[str], ecc_enabled: bool | None = None,
                  telemetry: "TelemetrySummary | None" = None, promise: Promise | None = None) -> Result:
    """One GPU's result from its worker outcome (gpucheck.workers.pool.WorkerOutcome); with the
    run's `promise` (workers.per_gpu.Promise), a stopped run is cut short, never a pass."""
    unfinished = unfinished_result(CHECK_ID, gpu, oc, injected, worker="pattern-test", setup_verb="test",
                                   partial=_partial, crash=_crash)
    if unfinished is not None or oc is None:
        return unfinished or Result(CHECK_ID, Status.ERROR, "no outcome from the worker pool", gpu=gpu)
    d = returned_data(oc)
    r = judge_data(gpu, d, p, device, injected, ecc_enabled=ecc_enabled, telemetry=telemetry)
    if oc.kind in (CANCELLED, OVER_BUDGET) or d.get("stopped"):
        stopped = d.get("stopped") or oc.kind
        r.evidence.append(f"stopped early ({stopped}): results are partial")
        if promise is not None:
            cut_short(r, promise, d.get("seconds"), stopped)
    return r


def _partial(r: Result, progress: "MemtestProgress | MemtestStall") -> None:
    if not progress:
        return
    report = cast("MemtestProgress", progress) if "pattern" in progress else None  # a pattern's (not a stall's)
    errors = report.get("errors") if report is not None else None
    fe = report.get("first_error") if report is not None else None
    if errors is not None:
        r.metric("errors", int(errors), "count")
    if fe:
        r.evidence.append("first error before it stopped: " + describe_error(fe))
    r.evidence.append(progress_evidence(progress, leave_out=("first_error",)))


def _fmt(x: float | None, unit: str = "") -> str:
    return "n/a" if x is None else f"{x:.4g}{unit}"


def _errors_view(d: "MemtestResult") -> ErrorsView:
    """Both rounds' error summaries as one: totals, histograms, confirmations and records (round-2
    records say so); the span and first offsets are the first round's (offsets are per round)."""
    e1 = d["errors"]
    h = d.get("headroom_round")
    e2 = h.get("errors") if h else None
    view: ErrorsView = {**e1, "headroom_errors": 0}
    if not e2:
        return view
    view["errors"] = int(e1["errors"]) + int(e2.get("errors", 0))
    view["headroom_errors"] = int(e2.get("errors", 0))
    view["steps_with_errors"] = int(e1.get("steps_with_errors", 0)) + int(e2.get("steps_with_errors", 0))
    view["persistent_words"] = int(e1.get("persistent_words", 0)) + int(e2.get("persistent_words", 0))
    view["records_kept"] = int(e1.get("records_kept", 0)) + int(e2.get("records_kept", 0))
    view["distinct_words_recorded"] = (int(e1.get("distinct_words_recorded", 0))
                                       + int(e2.get("distinct_words_recorded", 0)))
    view["up"] = [a + b for a, b in zip(e1["up"], e2["up"])]
    view["down"] = [a + b for a, b in zip(e1["down"], e2["down"])]
    view["bits"] = [b for b in range(64) if view["up"][b] or view["down"][b]]
    view["confirmations"] = (list(e1.get("confirmations", []))
                             + [{**c, "round": 2} for c in e2.get("confirmations", [])])
    view["records"] = list(e1.get("records", [])) + [{**r, "round": 2} for r in e2.get("records", [])]
    return view


def _miscompare_cause(e: ErrorsView, region: int, how: str, passes: int, ecc_enabled: bool | None
                      ) -> tuple[str, Action, list[str]]:
    """The summary, action and evidence for miscompares (see the module doc for the rules)."""
    n_err = int(e["errors"])
    confirmations = e.get("confirmations", [])
    persistent = int(e.get("persistent_words", 0))
    first = e["records"][0] if e.get("records") else None
    span = ""
    if e.get("first_offset") is not None and e.get("last_offset") != e.get("first_offset"):
        span = f" between offsets {e['first_offset']:#x} and {e['last_offset']:#x}"
    runs_with_errors = int(e.get("steps_with_errors", 0))
    if persistent or any(c.get("reproduced") for c in confirmations):
        kind, action = f"persistent: {max(persistent, 1)} word(s) failed again in another verify run", Action.RMA
    elif runs_with_errors >= 2:
        # Two verify runs saw errors, at different words: two separate faults, not one upset.
        again = [c for c in confirmations if c.get("errors_again")]
        kind = (f"recurring: {runs_with_errors} verify runs found errors, at different words"
                + (f" (the rerun of {again[0]['pattern']} found {again[0]['errors_again']} again)" if again else ""))
        action = Action.RMA
    elif confirmations:
        kind, action = "transient: the rerun of the pattern was clean", Action.DRAIN
    else:
        kind = "transient: not seen in the other passes" if passes > 1 else "not re-tested"
        action = Action.DRAIN
    ecc_note = "; ECC is enabled, so this data was wrong without an ECC error (silent corruption)" if ecc_enabled else ""
    headroom = f" ({e['headroom_errors']} in the headroom round)" if e.get("headroom_errors") else ""
    cause = (f"memory errors: {n_err}{headroom} in {human_bytes(region)} tested ({how}){span}; first at "
             f"{describe_error(first) if first else 'an unrecorded offset'}; bits flipped: "
             f"{histogram_text(e['up'], e['down'], limit=8)}; {kind}{ecc_note}")
    evidence = ["error " + describe_error(rec) for rec in e.get("records", [])]
    more = n_err - len(e.get("records", []))
    if more > 0:
        evidence.append(f"... {more} more miscompare(s) counted, not listed (first {len(e.get('records', []))} by "
                        f"offset shown; {e.get('records_kept', 0)} recorded)")
    evidence.append("bit histogram (all errors): " + histogram_text(e["up"], e["down"], limit=64))
    for c in confirmations:
        where = " (headroom round)" if c.get("round") == 2 else ""
        evidence.append(f"confirmation{where}: {c['pattern']} pass {c['pass']} found {c['errors']} error(s), the "
                        f"rerun {c['errors_again']}, {c['same_words']} recorded word(s) in both")
    if e.get("persistent_offsets"):
        evidence.append("persistent offsets: " + ", ".join(f"{o:#x}" for o in e["persistent_offsets"]))
    evidence.append("action: rma for a fault that reproduces at the same word or recurs in another verify run "
                    "(a reset does not fix a bad cell or row; row remapping only follows ECC-detected errors), "
                    "drain for one seen in a single verify run whose rerun was clean (re-test after a GPU "
                    "reset; rma if it recurs)")
    return cause, action, evidence


def _ecc_inputs(d: "MemtestResult", p: EccLimitParams, device: str
                ) -> tuple[dict[str, int | None], dict[str, int | None], dict[str, str], list[str], list[str]]:
    """ECC_RULES over the counters read around the passes: metrics, limits (None: the rules are
    off, no counter was read), facts, evidence, and the counters a rule needed that could not be
    read."""
    ecc = d.get("ecc")
    reads = (ecc.get("reads") if ecc else None) or []
    off = ecc_limits(None)
    failure = ecc.get("failure") if ecc else None
    if failure:
        return {}, off, {}, [], [f"ECC counters ({failure})"]
    if not reads:
        note = (ecc.get("note") if ecc else None) or ("no ECC counters read" if device == "cuda" else
                                   "no ECC counters: a CPU worker stands in for the GPU")
        return {}, off, {}, [note], []
    g = growth(reads)
    metrics: dict[str, int | None] = {}
    facts: dict[str, str] = {}
    unread: list[str] = []
    unsupported = []
    for rule in ECC_RULES:
        counter = COUNTER_OF[rule.metric]
        entry = g[counter]
        metrics[rule.metric] = entry["value"]
        steps = "; ".join(f"{b} -> {a}: {'+' if n > 0 else ''}{n}" for b, a, n in entry["steps"])
        facts[f"{rule.metric}_steps"] = f" ({steps})" if steps else ""
        if entry["unread"]:
            unread.append(f"{counter} ({entry['unread']})")
        elif entry["value"] is None:
            unsupported.append(counter)
    labels = ", ".join(r["label"] for r in reads)
    evidence = [f"ECC counters ({ecc.get('source') if ecc else None}) read {len(reads)} times: {labels}"]
    if unsupported:
        evidence.append(f"not supported on this GPU (not judged): {', '.join(unsupported)}")
    return metrics, ecc_limits(p), facts, evidence, unread


def _plan_evidence(d: "MemtestResult", device: str, gpu: int, region: int, patterns: list[str]) -> list[str]:
    evidence: list[str] = []
    cfg = d.get("config")
    if cfg:
        loop = (f"loop for {cfg['duration_s']:g} s" if cfg.get("duration_s") is not None
                else f"{cfg.get('passes')} pass(es)")
        evidence.append(f"plan: memtest_fraction {cfg.get('fraction'):g} of the free memory"
                        + (" (GPUs only; a CPU stand-in tests cpu_bytes)" if device == "cpu" else "")
                        + f", {loop}, patterns {', '.join(patterns)}, seed {cfg.get('seed')}"
                        + (", then a headroom round" if cfg.get("headroom_round") else ""))
    if device == "cpu":
        evidence.append(f"CPU worker {gpu} standing in for a GPU: the NumPy path over "
                        f"{human_bytes(region)} of host memory")
    else:
        mem, dev = d.get("memory", {}), d.get("device", {})
        evidence.append(f"device {dev.get('name')!r}: tested {human_bytes(region)} in {mem.get('chunk_count')} "
                        f"chunk(s) of up to {human_bytes(mem.get('chunk_bytes') or 0)}; free "
                        f"{human_bytes(mem.get('free_bytes') or 0)} of {human_bytes(mem.get('total_bytes') or 0)}, "
                        f"headroom kept {human_bytes(mem.get('headroom_bytes') or 0)}")
        per_sm = dev.get("blocks_per_sm") or {}
        if per_sm:
            kinds = {k: min(v for name, v in per_sm.items() if name.startswith(f"memtest_{k}")) for k in
                     ("check", "fill", "scrub") if any(name.startswith(f"memtest_{k}") for name in per_sm)}
            evidence.append("kernels: blocks per SM from the occupancy API: "
                            + ", ".join(f"{k} {v}" for k, v in kinds.items())
                            + f" (one wave on {dev.get('sms')} SMs); L2 {human_bytes(dev.get('l2_bytes') or 0)}, "
                            f"scrub buffer {human_bytes(dev.get('scrub_bytes') or 0)}")
    h = d.get("headroom_round")
    if h:
        reserve = h.get("reserve_bytes")
        evidence.append(f"headroom round: released {human_bytes(h.get('released_bytes') or 0)} of the first round, "
                        f"kept {human_bytes(h.get('held_bytes') or 0)} allocated, then tested "
                        f"{human_bytes(h.get('region_bytes') or 0)} ({h.get('passes', 0)} pass)"
                        + (f", leaving {human_bytes(reserve)} free" if reserve else ""))
    return evidence


def _tail_evidence(d: "MemtestResult", ratio: float | None, injected: list[str]) -> list[str]:
    evidence: list[str] = []
    per = d.get("per_pattern", {})
    if per:
        evidence.append("per pattern: " + "; ".join(
            f"{name} {v['runs']} run(s) {_fmt(v.get('gbps'), ' GB/s')}" + (f" {v['errors']} error(s)" if v["errors"] else "")
            for name, v in per.items()))
    cp: MemtestCopy = d.get("copy") or {}
    if cp.get("gbps"):
        evidence.append(f"device-to-device copy baseline: {human_bytes(cp['bytes'])} x {cp.get('repeats')}, median "
                        f"{_fmt(cp['gbps'], ' GB/s')} counting bytes read + written; memtest/copy ratio "
                        f"{_fmt(ratio)} (reported, not judged: eud.bandwidth judges HBM speed)")
    elif cp.get("note"):
        evidence.append(f"no copy baseline: {cp['note']}")
    evidence.extend(d.get("notes", []))
    h = d.get("headroom_round")
    if h and h.get("allocation_note"):
        evidence.append(f"headroom round: {h['allocation_note']}")
    evidence.extend(f"injected {x}" for x in d.get("injected", []))
    if any(x.startswith("bitflip") for x in injected) and not any(
            x.startswith("bitflip") for x in d.get("injected", [])) and not d.get("inject_problem"):
        evidence.append("the bitflip injection did not fire (stopped before its pattern ran)")
    return evidence


# Miscompares fail the GPU (the action the miscompares call for: rma for a persistent or recurring
# fault, drain for a transient one, see _miscompare_cause), then ECC_RULES; an Xid during the test
# asks for a look. Limits by key (see judge_data).
RULES: tuple[Rule, ...] = (
    Rule("errors", ">", 0, Status.FAIL, Key("miscompare_action"), "{miscompare} ({detail})", "count"),
    *ECC_RULES,
    Rule("xid_events", ">", Key("xid_limit"), Status.WARN, Action.INVESTIGATE,
         "Xid {xids} during the pattern test (see the xid check) ({detail})", "count"),
)


def _copy_gbps(d: "MemtestResult") -> float | None:
    """The copy baseline's bandwidth, None when there is none."""
    cp = d.get("copy")
    return cp.get("gbps") if cp else None


def _metrics(d: "MemtestResult", e: ErrorsView, ratio: float | None) -> tuple[dict[str, _Metric], dict[str, str]]:
    gbps, copy, h = d.get("gbps"), _copy_gbps(d), d.get("headroom_round")
    metrics: dict[str, _Metric] = {
        "errors": int(e["errors"]), "bytes_tested": int(d["region_bytes"]), "passes": int(d.get("passes", 0)),
        "patterns": len(d.get("patterns", [])),
        "bandwidth_gbps": None if gbps is None else round(gbps, 3), "copy_gbps": None if copy is None else round(copy, 3),
        "bandwidth_ratio": None if ratio is None else round(ratio, 3),
        "error_words_recorded": int(e.get("distinct_words_recorded", 0)),
        "persistent_error_words": int(e.get("persistent_words", 0)),
        "first_error_offset": e.get("first_offset"), "last_error_offset": e.get("last_offset"),
        "flipped_bits": {str(b): e["up"][b] + e["down"][b] for b in e.get("bits", [])},
        "flipped_bits_0to1": {str(b): e["up"][b] for b in e.get("bits", []) if e["up"][b]},
        "flipped_bits_1to0": {str(b): e["down"][b] for b in e.get("bits", []) if e["down"][b]},
    }
    units = {"errors": "count", "bytes_tested": "B", "passes": "count", "patterns": "count",
             "bandwidth_gbps": "GB/s (written + read)", "copy_gbps": "GB/s (read + written)",
             "error_words_recorded": "count", "persistent_error_words": "count",
             "first_error_offset": "B", "last_error_offset": "B"}
    if h is not None:
        metrics["headroom_bytes_tested"], units["headroom_bytes_tested"] = int(h.get("region_bytes") or 0), "B"
        metrics["headroom_errors"], units["headroom_errors"] = int(e.get("headroom_errors", 0)), "count"
    return metrics, units


def judge_data(gpu: int, d: "MemtestResult", p: EccLimitParams, device: str, injected: list[str],
               ecc_enabled: bool | None = None, telemetry: "TelemetrySummary | None" = None) -> Result:
    """One GPU's result from the worker's data (pure; see the module doc and RULES)."""
    e = _errors_view(d)
    h = d.get("headroom_round")
    region = int(d["region_bytes"]) + int((h.get("region_bytes") if h else None) or 0)
    passes, patterns = int(d.get("passes", 0)), list(d.get("patterns", []))
    gbps, copy = d.get("gbps"), _copy_gbps(d)
    ratio = (gbps / copy) if gbps and copy else None
    metrics, units = _metrics(d, e, ratio)
    how = f"{len(patterns)} pattern(s) x {passes} pass(es)" + (" + a headroom round" if h and h.get("passes") else "")
    evidence = _plan_evidence(d, device, gpu, int(d["region_bytes"]), patterns)
    limits: dict[str, Action | int | None] = {"miscompare_action": Action.DRAIN, "xid_limit": None}
    facts: dict[str, str] = {}
    if metrics["errors"]:
        facts["miscompare"], limits["miscompare_action"], ev = _miscompare_cause(e, region, how, passes, ecc_enabled)
        evidence.extend(ev)
    em, el, ef, ecc_evidence, unread = _ecc_inputs(d, p, device)
    metrics.update(em)
    units.update({k: "count" for k in em})
    limits.update(el)
    facts.update(ef)
    ok = f"no memory errors in {human_bytes(region)} tested ({how}); {_fmt(gbps, ' GB/s')} written + read"
    if ratio is not None:
        ok += f" = {ratio:.2f} of a device-to-device copy ({_fmt(copy, ' GB/s')})"
    if em and not unread:
        ok += "; ECC counters did not grow"
    tel = telemetry
    if tel is not None and tel.get("samples"):
        xids = tel.get("xid") or []
        metrics["xid_events"], units["xid_events"], limits["xid_limit"] = len(xids), "count", 0
        facts["xids"] = ", ".join(map(str, xids))
    res = evaluate(CHECK_ID, RULES, metrics, limits=limits, facts=facts, units=units, ok_summary=ok, gpu=gpu)
    _could_not_judge(res, d, unread)
    res.evidence = evidence + ecc_evidence + res.evidence + _tail_evidence(d, ratio, injected)
    xid_note = tel.get("xid_note") if tel is not None else None
    if xid_note:
        res.evidence.append(xid_note)
    res.injected = list(injected)
    return res


def _could_not_judge(res: Result, d: "MemtestResult", unread: list[str]) -> None:
    """What leaves the result unjudged (error; a fail found from what was verified stands, and
    names it in the evidence): an injection that could not be made, a stop before anything was
    verified, ECC counters that could not be read, a headroom round that could not allocate."""
    per = d.get("per_pattern", {})
    h = d.get("headroom_round")
    marks: dict[str, str] = {}  # what could not be judged -> the summary that names it
    if d.get("inject_problem"):
        marks["injection"] = f"could not inject: {d['inject_problem']}"
    if d.get("stopped") and res.status == Status.PASS and not any(v["runs"] for v in per.values()):
        marks["patterns"] = f"not finished: stopped ({d['stopped']}) before any pattern was verified"
    if unread:
        marks["ECC counters"] = (f"could not judge the ECC counters around the passes: {', '.join(unread)} could not "
                                 f"be read; {res.summary}")
    if h is not None and not h.get("passes") and not d.get("stopped"):
        why = h.get("allocation_note") or "nothing could be allocated"
        marks["headroom round"] = f"could not test the headroom: {why}; {res.summary}"
    if not marks:
        return
    res.unjudged.update(dict.fromkeys(marks, Status.ERROR))
    if res.status == Status.FAIL:
        if "injection" in marks:
            res.evidence.append(marks["injection"])
        return
    settle(res)
    res.summary = next(iter(marks.values()))


CHECKS = [memtest]
