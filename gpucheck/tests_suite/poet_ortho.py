"""poet.ortho: POET-style orthogonal matmuls on every GPU at once, verified by invariants that
hold in exact arithmetic (docs/poet.md).

One worker process per GPU (gpucheck.workers.pool) runs gpucheck.poet.worker.poet_worker for the
duration: a loop of fresh random problems (Cayley-Neumann blocks, block-diagonal orthogonal
matmuls with fused permutations, a dense GEMM, merges), every (dtype, block size) pair in turn,
on the CUDA kernels of gpucheck/kernels/poet.cu through CuPy (the torch implementation on CPU
workers and on GPUs without CuPy). Per GPU one result:

- fail "silent data corruption: <invariant> (<dtype>, block <b>): error <e> > bound <bound>" when
  any invariant was violated; action drain (as the burn's SDC);
- fail "hang" / "poet worker crashed" as for the burn (reset-gpu; investigate for a crash that
  names no CUDA error);
- error when gpucheck could not judge (no CUDA in torch, the kernels did not compile, nothing
  finished before a stop);
- pass otherwise, with the number of problems, the worst error/bound ratio seen per invariant,
  and, where CuPy is missing on a GPU, "the CUDA kernels were not exercised" in the summary (a
  pass, not a warn: the GPU computed every operation correctly through torch; the missing CuPy is
  an installation matter that must not turn a healthy node's gate red under --strict).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..platform.durations import parse_duration
from ..poet.bounds import PoetInputError, parse_blocks, parse_dtypes
from ..sdk import (MAX_DIMENSION, Action, Context, InjectionArgs, Level, Limit, Need, Result, Rule, Status, choice,
                   define, evaluate, injections_for_gpu, option)
from ..sdk.workers import (LoadParams, LoadTime, Promise, finish_result, guarded_targets, job_gpu, progress_evidence,
                           returned_data, run_per_gpu, stopped_early, telemetry_summary, unfinished_result)

if TYPE_CHECKING:  # pragma: no cover
    from ..poet.worker import PoetArgs
    from ..sdk.workers import PerGpuRun, PoetProgress, PoetResult, PoetViolation, SetupError, WorkerJob, WorkerOutcome

CHECK_ID = "poet.ortho"


class PoetParams(LoadParams):
    """poet.ortho's parameters (DEFAULTS, merged with the config's [checks."poet.ortho"])."""

    dtypes: list[str]
    blocks: list[int]
    size: int
    rows: int
    cpu_blocks: int
    cpu_rows: int
    rho_min: float
    rho_max: float
    chain_steps: int
    verify_rows: int
    ortho_blocks: int
    q_pool: int
    dense_acc_roundoff: float
    bound_scale: float
    seed: int
    backend: str
    window_s: float
    max_events: int


DEFAULTS: PoetParams = {
    "duration_s_level2": 30.0,
    "duration_s_level3": 300.0,
    "duration_s_level4": 1800.0,
    "dtypes": ["fp32", "bf16", "fp16"],
    "blocks": [32, 64, 128, 256],
    "size": 4096,  # n: features of x and W on a GPU (a multiple of every block size)
    "rows": 4096,  # m: rows of x on a GPU
    "cpu_blocks": 2,  # on CPU workers n = cpu_blocks * b
    "cpu_rows": 64,
    "rho_min": 0.1,  # ||Q||_2 of each block drawn uniformly in [rho_min, rho_max]
    "rho_max": 0.5,
    "chain_steps": 3,  # merges in the merge-then-reinitialize chain (the first is W_eff)
    "verify_rows": 256,  # rows compared input-centric vs weight-centric
    "ortho_blocks": 4,  # blocks per problem whose ||G^T G - I||_2 is measured (eigensolver)
    "q_pool": 8,  # base skew-symmetric matrices per block size
    "dense_acc_roundoff": 2.0**-23,  # accumulator roundoff budgeted for cuBLAS GEMMs
    "bound_scale": 1.0,  # multiplies every derived bound (1: as derived in docs/poet.md)
    "seed": 0,
    "backend": "auto",  # auto: CuPy kernels on GPUs when installed, torch otherwise; or cupy / torch
    "window_s": 1.0,
    "max_events": 8,
    "heartbeat_timeout_s": 30.0,  # a worker sends a heartbeat after every operation
    "startup_timeout_s": 120.0,  # spawn + torch import + CUDA init (the kernel compile comes after)
    "sample_interval_s": 1.0,
}
# What a setting may be where gpucheck.core.config.conventional_limit is not enough: sizes and counts
# of work are at least 1 (0 would examine nothing).
LIMITS = {
    **{k: Limit("int", 1) for k in ("size", "rows", "cpu_blocks", "cpu_rows", "chain_steps", "verify_rows",
                                     "ortho_blocks", "q_pool")},
    "blocks": Limit("list", item="int", low=1),
    "rho_min": Limit("real", 0, 1, below=True),  # ||Q||_2 of a block: in [0, 1) (rho_min <= rho_max: checked by
    "rho_max": Limit("real", 0, 1, below=True),  # the worker's PoetConfig.validate)
    "max_events": Limit("int", 1),
    "dense_acc_roundoff": Limit("real", 0, above=True),
    "bound_scale": Limit("real", 0, above=True),
    "backend": Limit("str", choices=("auto", "cupy", "torch")),
}


@dataclass(frozen=True)
class PoetOptions:
    """`gpucheck poet`'s options (None: not given, the level's default or the config's applies)."""

    duration_s: float | None = option(
        "--duration", parse=parse_duration,
        help="How long: 30s, 5m, 1h or seconds (default by level: 30 s at 2, 300 s at 3, 1800 s at 4).")
    blocks: Sequence[int] | str | None = option(
        "--block", "list", parse=parse_blocks, error=PoetInputError,
        help="Comma list of block sizes from 32,64,128,256 (repeatable; default all).")
    dtypes: Sequence[str] | str | None = option(
        "--dtype", "list", parse=parse_dtypes, error=PoetInputError,
        help="Comma list of fp32,bf16,fp16 (repeatable; default all).")
    size: int | None = option(
        "--size", "int", low=32, high=MAX_DIMENSION,
        help="n, the features of x and W: a multiple of every block size (default 4096 on GPUs, "
             "2 blocks on CPU workers).")
    rows: int | None = option("--rows", "int", low=1, high=MAX_DIMENSION,
                              help="m, the rows of x (default 4096 on GPUs, 64 on CPU workers).")
    backend: str | None = option(
        "--backend", "choice", choices=LIMITS["backend"].choices,
        help="auto (default): the CUDA kernels through CuPy on GPUs when CuPy is installed, torch otherwise.")


@dataclass(frozen=True)
class RunSettings:
    """What this run computes: ctx.options over the parameters (_run_settings)."""

    dtypes: list[str]
    blocks: list[int]
    size: int | None  # None: the worker's default for its device
    rows: int | None
    backend: str


# The time functions (parameters, duration, budget, promise, least slice): gpucheck.workers.per_gpu.
TIME = LoadTime(CHECK_ID, DEFAULTS, "POET problems", PoetOptions)
_params = TIME.params
poet_duration = TIME.duration


def _injection_args(ctx: Context, gpu: int, settings: RunSettings | None = None) -> InjectionArgs:
    """Worker args for the injections that target `gpu`, their texts, and a usage problem (with
    `settings`, a bit that the flipped problem's dtype does not have is one)."""
    from ..poet.invariants import INJECT_OPS
    from ..poet.worker import PoetConfig

    def inject(inj: Any, args: dict[str, Any]) -> None:
        if inj.kind == "hang":
            args["hang_after_s"] = float(inj.get("after", 1.0))
            return
        op = choice(inj, "op", "forward", INJECT_OPS)
        args["bitflip"] = {"op": op, **{k: (None if inj.get(k) is None else int(inj.get(k)))
                                        for k in ("bit", "row", "col", "problem")}}
        if settings is not None:
            PoetConfig(dtypes=settings.dtypes, blocks=settings.blocks, bitflip=args["bitflip"])._validate_bitflip()

    return injections_for_gpu(ctx.injections, gpu, ("bitflip", "hang"), inject)


def _run_settings(ctx: Context, p: PoetParams) -> RunSettings:
    """dtypes, blocks, size, rows and backend of this run (its options over the config); ValueError."""
    from ..poet.worker import BACKENDS

    given = ctx.options_for(PoetOptions)
    dtypes = parse_dtypes(given.dtypes or p["dtypes"])
    blocks = parse_blocks(given.blocks or p["blocks"])
    gpu = ctx.device != "cpu"
    size = given.size or (p["size"] if gpu else None)
    rows = given.rows or (p["rows"] if gpu else None)
    if size is not None:
        size = int(size)
        bad = [b for b in blocks if size % b]
        if size <= 0 or bad:
            raise ValueError(f"size {size} is not a multiple of block size(s) {', '.join(map(str, bad))}")
    if rows is not None and int(rows) < 1:
        raise ValueError(f"rows must be positive, not {rows}")
    backend = str(given.backend or p["backend"])
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if backend == "cupy" and ctx.device == "cpu":
        raise ValueError("backend cupy needs GPUs (the CUDA kernels), not CPU workers")
    return RunSettings(dtypes=dtypes, blocks=blocks, size=size, rows=None if rows is None else int(rows),
                       backend=backend)


@define(
    CHECK_ID,
    title="POET orthogonal matmuls (Cayley-Neumann blocks, block-diagonal kernels, merges) on every GPU, "
          "verified by orthogonality invariants",
    level=Level.STANDARD,
    needs=(Need.TORCH, Need.GPU),
    budget_s=DEFAULTS["duration_s_level2"] + DEFAULTS["startup_timeout_s"] + 30.0,  # at level 2; budget_fn rules
    budget_fn=TIME.budget,
    detects="silent data corruption in batched small matmuls, permutation gathers and custom CUDA kernels; "
            "GPUs that hang or crash under that load",
    defaults=DEFAULTS,
    limits=LIMITS,
    injects=("bitflip", "hang"),
    min_slice_fn=TIME.min_slice,
    top_level=Level.BURN_IN,
    options=PoetOptions,
)
def poet_ortho(ctx: Context) -> list[Result]:
    p, promise, problem = TIME.start(ctx)
    if problem is not None:
        return [problem]
    device = "cpu" if ctx.device == "cpu" else "cuda"
    duration = promise.seconds
    notes: list[str] = []

    def make_args(g: int | None) -> "PoetArgs":
        return {"duration_s": duration, "dtypes": settings.dtypes, "blocks": settings.blocks,
                "size": settings.size, "rows": settings.rows, "gpu_size": p["size"], "gpu_rows": p["rows"],
                "backend": settings.backend, "rho_min": p["rho_min"], "rho_max": p["rho_max"],
                "chain_steps": p["chain_steps"], "verify_rows": p["verify_rows"], "ortho_blocks": p["ortho_blocks"],
                "q_pool": p["q_pool"], "dense_acc_roundoff": p["dense_acc_roundoff"],
                "bound_scale": p["bound_scale"], "seed": p["seed"], "window_s": p["window_s"],
                "max_events": p["max_events"], "cpu_blocks": p["cpu_blocks"], "cpu_rows": p["cpu_rows"]}

    try:
        from ..poet.worker import PoetConfig

        settings = _run_settings(ctx, p)
        PoetConfig.from_args(make_args(None))  # every option as the workers will read it
    except (TypeError, ValueError) as e:
        return [Result(CHECK_ID, Status.ERROR, f"bad option: {e}")]

    targets, results, guard = guarded_targets(ctx, device, CHECK_ID, "tested")  # GPUs in use: skipped
    if not targets:
        return results or [Result(CHECK_ID, Status.SKIP, "no GPU selected")]

    run: "PerGpuRun[PoetResult | SetupError, PoetProgress]" = run_per_gpu(
        ctx, CHECK_ID, "gpucheck.poet.worker:poet_worker", targets, device=device, p=p,
        budget_s=TIME.pool_budget_s(p, duration),
        make_args=make_args,
        injection_args=lambda g: _injection_args(ctx, g, settings),
    )
    results.extend(run.results)
    if not run.jobs:
        return results
    results.extend(judge_outcomes(device, promise, run.jobs, run.outcomes, run.sampler, run.injected, notes,
                                  run.elapsed_s))
    return sorted(guard.annotate(results), key=lambda r: (r.gpu is None, r.gpu or 0))


# ---------------------------------------------------------------------------------------------
# judging (pure: worker data in, Results out)


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) else str(x)


def describe_violation(v: "PoetViolation") -> str:
    """'<invariant> (<dtype>, block <b>): error <e> > bound <bound>'."""
    return f"{v['invariant']} ({v['dtype']}, block {v['block']}): error {_fmt(v['error'])} > bound {_fmt(v['bound'])}"


def _violation_detail(v: "PoetViolation") -> str:
    parts = [f"problem {v['problem']} ({v.get('distribution', '?')} data, n={v.get('size')}, m={v.get('rows')})",
             f"op {v['op']}"]
    if v.get("where"):
        parts.append(str(v["where"]))
    for key in ("elements", "rows_bad"):
        if v.get(key):
            parts.append(f"{v[key]} {'element' if key == 'elements' else 'row'}(s) out of bound")
    if "got" in v:
        parts.append(f"got {_fmt(v['got'])}, expected {_fmt(v['expected'])}")
    if "measured" in v:
        parts.append(f"||GᵀG−I||₂ {_fmt(v['measured'])} vs theory 2ρ⁴−ρ⁸ = {_fmt(v['theory'])} (ρ = {_fmt(v['rho'])})")
    if "value" in v:
        parts.append(f"ratio {_fmt(v['value'])} outside [{_fmt(v['lo'])}, {_fmt(v['hi'])}]")
    if v.get("injected"):
        parts.append("injected fault in this problem")
    return "SDC " + describe_violation(v) + ": " + "; ".join(parts)


def judge_outcomes(device: str, promise: Promise | float, jobs: "list[WorkerJob]",
                   outcomes: "dict[str, WorkerOutcome[PoetResult | SetupError, PoetProgress]]", sampler: Any,
                   injected: dict[int, list[str]], notes: list[str], elapsed: float) -> list[Result]:
    """`promise`: a workers.per_gpu.Promise, or the promised seconds (a cut run is not a pass)."""
    if not isinstance(promise, Promise):
        promise = Promise(float(promise), "the requested duration", "POET problems")

    out: list[Result] = []
    for j in jobs:
        g = job_gpu(j)
        oc = outcomes.get(j.worker_id)
        inj = injected.get(g, [])
        tel = telemetry_summary(sampler, g, device)
        r = unfinished_result(CHECK_ID, g, oc, inj, worker="poet", setup_verb="run POET", partial=_partial)
        if r is None:
            r = judge_data(g, returned_data(oc), inj)
            stopped_early(r, outcomes[j.worker_id], promise)
        out.append(finish_result(r, tel, device=device, gpu=g, notes=notes, elapsed_s=elapsed))
    return out


def _partial(r: Result, progress: "PoetProgress") -> None:
    if progress.get("problems") is not None:
        r.metric("problems", int(progress["problems"]), "count")
    if progress:
        r.evidence.append(progress_evidence(progress))


# Any violated invariant is silent data corruption: fail, drain (as the burn's SDC).
RULES: tuple[Rule, ...] = (
    Rule("violations", ">", 0, Status.FAIL, Action.DRAIN, "silent data corruption: {sdc_text} ({detail})", "count"),
)


def _sdc_text(events: "list[PoetViolation]", n_viol: int) -> str:
    """The first violation (and how many more), or the count when none was kept."""
    if events:
        return describe_violation(events[0]) + (f"; {n_viol - 1} more violation(s)" if n_viol > 1 else "")
    return f"{n_viol} violation(s) (details not kept)"


def judge_data(g: int, d: "PoetResult", inj: list[str]) -> Result:
    """One GPU's worker data -> its Result: metrics and evidence here, status and action from RULES."""
    problems = int(d.get("problems", 0))
    n_viol = int(d.get("violation_count", 0))
    events = d.get("violations", [])
    metrics, units, worst = _metrics(d, problems, n_viol)
    evidence = _evidence(d, events, inj)
    if n_viol == 0 and (problems == 0 or d.get("out_of_memory")):
        # nothing judged, or a run cut short by a sizing problem: could not judge, never a pass
        res = Result(CHECK_ID, Status.ERROR, _not_judged(d, problems), gpu=g, injected=list(inj))
        res.metrics.update(metrics)
        res.units.update(units)
        res.evidence = evidence
        return res
    res = evaluate(CHECK_ID, RULES, metrics, facts={"sdc_text": _sdc_text(events, n_viol)}, units=units, gpu=g,
                   ok_summary=_ok_summary(d, problems, worst))
    res.evidence = evidence
    res.injected = list(inj)
    return res


def _metrics(d: "PoetResult", problems: int, n_viol: int
             ) -> tuple[dict[str, float | None], dict[str, str], dict[str, float]]:
    """The counts, the effective TFLOP/s and the worst error/bound ratio per invariant (inf: a
    ratio the worker could not compute, reported as None)."""
    combos = d.get("combos", {})
    metrics: dict[str, float | None] = {"problems": problems, "violations": n_viol,
                               "launches": sum(int(c.get("launches", 0)) for c in combos.values()),
                               "cuda_kernels": 1 if d.get("cuda_kernels") else 0}
    units: dict[str, str] = {"problems": "count", "violations": "count", "launches": "count", "cuda_kernels": "bool"}
    tflops = d.get("tflops")
    if tflops is not None:
        metrics["tflops_effective"] = float(tflops)
        units["tflops_effective"] = "TFLOP/s"
    worst: dict[str, float] = {}
    for c in combos.values():
        for name, r in (c.get("max_ratio") or {}).items():
            r = float("inf") if r is None else float(r)
            worst[name] = max(worst.get(name, 0.0), r)
    for name, r in sorted(worst.items()):
        metrics[f"max_ratio_{name}"] = float(r) if r != float("inf") else None
        units[f"max_ratio_{name}"] = "of bound"
    return metrics, units, worst


def _evidence(d: "PoetResult", events: "list[PoetViolation]", inj: list[str]) -> list[str]:
    """The device and backend, each dtype/block pair's tally, every violation, the injections."""
    dev = d.get("device", {})
    backend = ("CUDA kernels (gpucheck/kernels/poet.cu) through CuPy " + str(dev.get("cupy") or "")).strip() \
        if d.get("cuda_kernels") else "torch implementation"
    evidence = [f"device {dev.get('name')!r}; backend: {backend}; torch {dev.get('torch')}"]
    for c in d.get("combos", {}).values():
        mr = c.get("max_ratio") or {}
        top = ", ".join(f"{k} {_fmt(v)}" for k, v in sorted(mr.items(), key=lambda kv: -(kv[1] or 0))[:3])
        evidence.append(f"{c['dtype']} block {c['block']}: {c['problems']} problems (n={c['size']}, m={c['rows']}), "
                        f"{c['launches']} kernel calls, {c['violations']} violations in {c['seconds']:.1f} s; "
                        f"worst error/bound: {top or 'n/a'}")
    evidence.extend(_violation_detail(v) for v in events)
    if d.get("backend_note"):
        evidence.append(str(d["backend_note"]))
    evidence.extend(f"injected {x}" for x in d.get("injected", []))
    if any(x.startswith("bitflip") for x in inj) and not d.get("injected"):
        evidence.append("the bitflip injection did not fire: the run ended before its problem")
    if d.get("out_of_memory"):
        evidence.append(str(d["out_of_memory"]))
    return evidence


def _not_judged(d: "PoetResult", problems: int) -> str:
    """Why a run with no violation is not a pass: out of memory, or no problem finished."""
    if d.get("out_of_memory"):
        return (f"could not run POET: {d['out_of_memory']} (a smaller --size/--rows, or GPU memory held "
                f"by another process?); {problems} problem(s) verified clean before that")
    why = f"stopped ({d['stopped']})" if d.get("stopped") else "the duration was too short for one problem"
    return f"no POET problem finished: {why}"


def _ok_summary(d: "PoetResult", problems: int, worst: dict[str, float]) -> str:
    """What a clean run verified: dtypes, blocks, path, invariants, the worst ratio, pairs not reached."""
    combos = d.get("combos", {})
    dtypes = sorted({c["dtype"] for c in combos.values() if c.get("problems")})
    blocks = sorted({c["block"] for c in combos.values() if c.get("problems")})
    ok = (f"{problems} POET problems verified ({', '.join(dtypes)}; blocks {', '.join(map(str, blocks))}) on the "
          f"{'CUDA kernels' if d.get('cuda_kernels') else 'torch path'}: {len(d.get('invariants', []))} invariants clean")
    finite = {k: v for k, v in worst.items() if v != float("inf")}
    if finite:
        name = max(finite, key=lambda k: finite[k])
        ok += f", worst error/bound {finite[name]:.2g} ({name})"
    missed = [f"{c['dtype']}/{c['block']}" for c in combos.values() if not c.get("problems")]
    if missed:  # the dtype and block lists above are unions: say which pairs were never run
        ok += f"; not reached: {', '.join(missed)} (of {len(combos)} dtype/block pairs; a longer --duration runs all)"
    if d.get("backend_note"):
        ok += f"; {d['backend_note']}"
    return ok


CHECKS = [poet_ortho]
