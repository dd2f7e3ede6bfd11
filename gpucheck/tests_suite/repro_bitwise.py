"""repro.bitwise: every GPU runs the same reference workloads on the same inputs; its bits must
match the recorded reference for its fingerprint, the node's other GPUs, and itself.

ByteRobust's "bitwise alignment test" as a gpucheck check. One worker process per GPU, all at
once (gpucheck.workers.pool), runs gpucheck.repro.worker:repro_worker: each selected workload
(gpucheck.repro.workloads) twice from scratch, a SHA-256 digest of each run's outputs, and the
GPU's fingerprint (gpucheck.repro.fingerprint). gpucheck.repro.judge turns the digests into one
result per GPU (see there for the findings) and one node result holding the node's digest set
per fingerprint, for fleet comparison (gpucheck.repro.majority.fleet_outliers).

Level 1 runs a fast subset (workloads_level1: the bf16 and fp32 GEMM suites), level 2 and above
every workload (workloads_level2; ReproOptions.workloads, `--workload`, chooses others). The
reference file (gpucheck.repro.store) comes from ReproOptions.reference (`gpucheck repro check
--reference FILE`; a missing file is an error)
or the check's `reference` parameter (default /etc/gpucheck/repro-refs.json; a missing file means
"no reference", and the GPUs are compared with each other and with themselves). A malformed
file is an error result naming the file and the place; as root, a file other users can change
gives a warn.

`--inject bitflip:gpu=N[,workload=W][,output=I][,element=E][,bit=B][,run=1|2]` flips one bit of
one output of one workload on that GPU before it is digested (both runs unless `run` is given:
a flip in both runs models deterministic corruption, a flip in one run models a flaky GPU).

A replayed telemetry snapshot (`--snapshot`) is another node's past: the test needs this node's
GPUs, so the runner skips it there (Need.GPU; CPU workers, `--device cpu`, still run).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, cast

from ..repro import DEFAULT_REFERENCE_PATH
from ..sdk import Action, Context, Level, Need, Result, Rule, Status, define, evaluate, injections_for_gpu, option

CHECK_ID = "repro.bitwise"

# A reference file that users other than root can change (store.permission_problems, counted):
# whoever can write it decides which digests pass. The per-GPU rules: gpucheck.repro.judge.RULES.
REFERENCE_RULES: tuple[Rule, ...] = (
    Rule("reference_permission_problems", ">", 0, Status.WARN, Action.INVESTIGATE,
         "reference file {reference} can be changed by other users: whoever can write it decides which digests "
         "pass", "count"),
)

if TYPE_CHECKING:  # pragma: no cover
    from ..repro.worker import ReproArgs, ReproBitflip
    from ..sdk.workers import ReproProgress, ReproResult, SetupError, WorkerJob, WorkerOutcome, WorkerProgress


class ReproParams(TypedDict):
    """repro.bitwise's parameters (DEFAULTS, merged with the config's [checks."repro.bitwise"])."""

    reference: str
    workloads_level1: list[str]
    workloads_level2: list[str]
    work_budget_s_level1: float
    work_budget_s_level2: float
    startup_timeout_s: float
    heartbeat_timeout_s: float


DEFAULTS: ReproParams = {
    "reference": DEFAULT_REFERENCE_PATH,  # the reference file; missing = no reference
    "workloads_level1": ["gemm.bf16", "gemm.fp32"],  # the fast subset
    "workloads_level2": ["all"],  # level 2 and above
    "work_budget_s_level1": 60.0,  # the two runs of the level-1 subset, after start-up
    "work_budget_s_level2": 600.0,
    "startup_timeout_s": 120.0,  # spawn + torch import + CUDA init
    "heartbeat_timeout_s": 60.0,  # a worker silent this long is hung
}


def reference_file(text: str) -> str | None:
    """`--reference FILE`: a reference file that loads (gpucheck.repro.store.RefFileError, a
    ValueError, says what is wrong with it); an empty text names none."""
    if not text:
        return None
    from ..repro import store

    store.load(text)
    return text


def workload_names(text: str) -> list[str]:
    """`--workload a,b`: the names of known workloads (or all); ValueError names an unknown one."""
    from ..repro.workloads import WORKLOADS

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n != "all" and n not in WORKLOADS]
    if bad:
        raise ValueError(f"unknown workload {bad[0]!r} (known: {', '.join(WORKLOADS)}, all)")
    return names


@dataclass(frozen=True)
class ReproOptions:
    """`gpucheck repro check`'s options (None: not given, the level's default or the config's applies)."""

    reference: str | None = option(
        "--reference", metavar="FILE", parse=reference_file,
        help="Reference file (default: the check's `reference` parameter, /etc/gpucheck/repro-refs.json; "
             "a missing default file means no reference).")
    workloads: Sequence[str] | None = option(
        "--workload", "list", metavar="NAME", parse=workload_names,
        help="Workloads to run (comma list or repeated; default by level: gemm.bf16,gemm.fp32 at 1, all at 2).")


def _params(ctx: Context) -> ReproParams:
    return ctx.params(CHECK_ID, DEFAULTS)


def _lv(ctx: Context) -> int:
    return 1 if int(ctx.level) <= 1 else 2


def _budget(ctx: Context) -> float:
    p = _params(ctx)
    return float(p["startup_timeout_s"]) + _work_budget_s(p, _lv(ctx))


def _work_budget_s(p: ReproParams, lv: int) -> float:
    """The two runs' time budget at level `lv` (1, or 2 and above), after start-up."""
    return float(p["work_budget_s_level1"] if lv == 1 else p["work_budget_s_level2"])


def _device(ctx: Context) -> str:
    return "cpu" if ctx.device == "cpu" else "cuda"


def _min_slice(ctx: Context) -> Any:
    """The workers' start-up floor: the workloads themselves take well under a second at level 1."""
    from ..sdk.workers import duration_slice  # lazy: level 1 loads no worker plumbing until it computes

    return duration_slice(ctx, None)


@dataclass
class Collected:
    """What the workers returned, keyed by GPU index, and everything said about GPUs not run."""

    device: str
    workloads: list[str]
    not_run: dict[str, str]
    outcomes: "dict[int, WorkerOutcome[ReproResult | SetupError, ReproProgress] | None]" = field(default_factory=dict)
    injected: dict[int, list[str]] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)  # skips and errors for GPUs not run
    elapsed_s: float = 0.0
    guard: Any = None  # gpucheck.workers.busy.Guard: GPUs in use were not run; --force notes


def selected_workloads(ctx: Context, p: ReproParams | None = None) -> tuple[list[str], dict[str, str]]:
    """The workloads this run asks for (options, else the level's list), for this device."""
    from ..repro.workloads import preset_for, select_workloads

    p = p or _params(ctx)
    names = ctx.options_for(ReproOptions).workloads or (p["workloads_level1"] if _lv(ctx) == 1 else p["workloads_level2"])
    return select_workloads(list(names), preset_for(_device(ctx)).name)


def _bitflip_spec(inj: Any, workloads: list[str]) -> "ReproBitflip":
    """One bitflip injection's worker args; ValueError naming what is wrong."""
    w = str(inj.get("workload", workloads[0]))
    if w not in workloads:
        raise ValueError(f"workload {w!r} is not run here (running: {', '.join(workloads)})")
    run = inj.get("run", "both")
    if str(run) not in ("1", "2", "both"):
        raise ValueError(f"run must be 1, 2 or both, not {run!r}")
    output = int(inj.get("output", 0))
    bit = int(inj.get("bit", 0))
    element = None if inj.get("element") is None else int(inj.get("element"))
    if output < 0 or bit < 0 or (element is not None and element < 0):
        raise ValueError("output, element and bit must not be negative")
    return {"workload": w, "output": output, "element": element, "bit": bit,
            "runs": [1, 2] if str(run) == "both" else [int(run)]}


def _bitflip_args(ctx: Context, gpu: int, workloads: list[str]) -> "tuple[ReproBitflip | None, list[str], str | None]":
    """Worker args for the bitflip injections that target `gpu`, their texts, and a problem."""

    def bitflip(inj: Any, args: dict[str, Any]) -> None:  # the last one for the GPU wins
        args.clear()
        args.update(_bitflip_spec(inj, workloads))

    args, texts, problem = injections_for_gpu(ctx.injections, gpu, ("bitflip",), bitflip)
    flip = cast("ReproBitflip", args) if args else None  # _bitflip_spec's: the last one for the GPU
    return flip if problem is None else None, texts, problem


def collect(ctx: Context, p: ReproParams | None = None) -> Collected:
    """Run the workers on the selected GPUs (or CPU workers). WorkloadError for a bad workload
    list (a usage problem)."""
    from ..repro.workloads import preset_for
    from ..sdk.workers import (WorkerJob, guarded_targets, job_gpu, pool, pool_budget,  # lazy: level 1 loads
                               stop_timings)  # no worker plumbing until it computes

    p = p or _params(ctx)
    device = _device(ctx)
    preset = preset_for(device)
    workloads, not_run = selected_workloads(ctx, p)
    col = Collected(device=device, workloads=workloads, not_run=not_run)
    for inj in ctx.injections:
        if inj.kind == "bitflip" and inj.get("gpu") is not None and not isinstance(inj.get("gpu"), int):
            col.results.append(Result(CHECK_ID, Status.ERROR, f"--inject {inj}: gpu must be an index, "
                                      f"not {inj.get('gpu')!r}; nothing was run", subject="injection",
                                      injected=[str(inj)]))
            return col
    targets, col.results, col.guard = guarded_targets(ctx, device, CHECK_ID, "tested")  # GPUs in use: skipped
    jobs = []
    driver = ctx.snapshot.get("driver_version") if device == "cuda" and ctx.snapshot else None
    for t in targets:
        g = t["gpu"]
        flip, texts, problem = _bitflip_args(ctx, g, workloads)
        col.injected[g] = texts
        if problem:
            col.results.append(Result(CHECK_ID, Status.ERROR, problem, gpu=g, injected=texts))
            continue
        args: ReproArgs = {"workloads": workloads, "preset": preset.name, "driver": driver}
        if flip:
            args["bitflip"] = flip
        jobs.append(WorkerJob(f"gpu{g}", gpu=g, device=device, args={**args},
                              visible_device=t["visible"] if device == "cuda" else None))
    ids = {t["gpu"] for t in targets}
    for inj in ctx.injections:
        want = inj.get("gpu")
        if inj.kind == "bitflip" and want is not None and want not in ids:
            unit = "CPU worker" if device == "cpu" else "GPU"
            col.results.append(Result(CHECK_ID, Status.ERROR, f"--inject {inj}: no {unit} {want} is tested here "
                                      f"(tested: {', '.join(map(str, sorted(ids))) or 'none'}); nothing was injected",
                                      subject="injection", injected=[str(inj)]))
    if not jobs:
        return col
    budget = pool_budget(ctx, float(p["startup_timeout_s"]) + _work_budget_s(p, _lv(ctx)))

    def on_progress(job: WorkerJob, info: "WorkerProgress") -> None:  # the repro worker's: ReproProgress
        ctx.report(CHECK_ID, f"gpu{job.gpu}", dict(info))

    t0 = time.monotonic()
    outcomes: "dict[str, WorkerOutcome[ReproResult | SetupError, ReproProgress]]" = pool.run_workers(
        "gpucheck.repro.worker:repro_worker",
        jobs,
        budget_s=budget,
        heartbeat_timeout_s=float(p["heartbeat_timeout_s"]),
        startup_timeout_s=float(p["startup_timeout_s"]),
        cancel=ctx.cancel,
        on_progress=on_progress,
        **stop_timings(ctx),
    )
    col.elapsed_s = time.monotonic() - t0
    col.outcomes = {job_gpu(j): outcomes.get(j.worker_id) for j in jobs}
    return col


def reference_path(ctx: Context, p: ReproParams | None = None) -> tuple[str, bool]:
    """(path, explicit): the --reference option, else the check's parameter."""
    explicit = ctx.options_for(ReproOptions).reference
    if explicit:
        return str(explicit), True
    return str((p or _params(ctx))["reference"]), False


@define(
    CHECK_ID,
    title="Bitwise reproducibility: reference GEMMs and a transformer training step, digests vs reference, peers and a rerun",
    level=Level.QUICK,
    needs=(Need.TORCH, Need.GPU),
    budget_s=DEFAULTS["startup_timeout_s"] + DEFAULTS["work_budget_s_level1"],  # shown by `gpucheck list`
    budget_fn=_budget,
    detects="silent data corruption (a GPU whose bits differ from the reference or its peers), non-deterministic GPUs",
    defaults=DEFAULTS,
    injects=("bitflip",),
    min_slice_fn=_min_slice,
    top_level=Level.STANDARD,
    options=ReproOptions,
)
def repro_bitwise(ctx: Context) -> list[Result]:
    from ..repro import store
    from ..repro.judge import judge_node
    from ..repro.workloads import WorkloadError

    p = _params(ctx)
    device = _device(ctx)
    path, explicit = reference_path(ctx, p)
    try:
        refs = store.load(path, missing_ok=not explicit)
    except store.RefFileError as e:
        return [Result(CHECK_ID, Status.ERROR, f"cannot use the reference file: {e}", subject="reference")]
    pre: list[Result] = []
    if refs is not None:
        problems = store.permission_problems(path)
        if problems:
            pre.append(_reference_permissions(path, problems))
    source = f"the reference file {path}" if refs is not None else f"{path} (no such file)"
    try:
        col = collect(ctx, p)
    except WorkloadError as e:
        return [Result(CHECK_ID, Status.ERROR, f"bad workload selection: {e}")]
    if not col.outcomes:
        if col.results:
            return pre + col.results
        return pre + [Result(CHECK_ID, Status.SKIP, "no GPU selected to test")]
    results = judge_node(CHECK_ID, col.outcomes, refs=refs, ref_source=source, injected=col.injected,
                         not_run=col.not_run)
    _cut_short(results, col)
    for r in results:
        if r.duration_s is None:
            r.duration_s = col.elapsed_s
        if device == "cpu" and r.gpu is not None:
            r.evidence.append(f"CPU worker {r.gpu} standing in for a GPU")
    out = pre + col.results + results
    if col.guard is not None:
        col.guard.annotate(out)
    return sorted(out, key=lambda r: (r.gpu is None, r.gpu or 0))


def _reference_permissions(path: str, problems: list[str]) -> Result:
    """The reference file's permission problems, judged by REFERENCE_RULES (subject reference)."""
    r = evaluate(CHECK_ID, REFERENCE_RULES, {"reference_permission_problems": len(problems)},
                 units={"reference_permission_problems": "count"}, facts={"reference": path},
                 subject="reference", ok_summary=f"reference file {path}: only root can change it")
    r.evidence = list(problems)
    return r


def _cut_short(results: list[Result], col: Collected) -> None:
    """A GPU stopped before every asked workload ran twice was not examined as asked: its pass
    (or warn) becomes an error naming what did not run."""
    from ..sdk.workers import Promise, cut_short, worker_data  # lazy: level 1 loads no worker plumbing until it computes

    promise = Promise(0.0, "this run", f"two runs of {', '.join(col.workloads)}")
    for r in results:
        oc = col.outcomes.get(r.gpu) if r.gpu is not None else None
        data = worker_data(oc)  # (a setup error is no data)
        runs = (data.get("runs") if data else None) or [{}, {}]
        asked = (data.get("workloads") if data else None) or []
        missing = [w for w in asked if w not in runs[0] or w not in runs[-1]]
        if missing and oc is not None and data is not None:
            cut_short(r, promise, data.get("seconds"), f"{data.get('stopped') or oc.kind}; not run twice: "
                                                         f"{', '.join(missing)}")


CHECKS = [repro_bitwise]
