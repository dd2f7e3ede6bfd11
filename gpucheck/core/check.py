"""The check contract: what a diagnostic declares, and what it is handed when it runs.

A check is a `Check`: a `CheckSpec` (id, description, level, needs, budget, defaults) and a run
function `run(ctx) -> list[Result]`. It never prints and never exits. Thresholds are data: every
check declares its defaults in `spec.defaults` (and, where the convention of
gpucheck.core.config.conventional_limit does not fit, what each may be set to in `spec.limits`); a
site's config overrides them per check, and the merged values reach the check as
`ctx.params(check_id)`.

Compute checks (a spec that needs a GPU, or says `compute=True`) load the GPUs; every other check
only reads (NVML, the kernel log). The runner runs the readers first, gives compute checks what is
left of the run's time limit, and does not start one whose `min_slice` does not fit (see
gpucheck.core.runner). A compute check that cannot run because the GPU, torch or CuPy is not usable is
a skip; `compute_skip` says whether that skip left unexamined what the run was asked to examine.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar, overload

from .levels import Level
from .options import declared
from .result import Result, Status

if TYPE_CHECKING:  # pragma: no cover
    from .config import Config
    from .inject import Injection
    from .state import State
    from ..platform.telemetry.model import GpuEntry, Snapshot
    from ..platform.telemetry.source import TelemetrySource

# A check's parameters: its TypedDict of defaults, and the merged values Context.params returns.
_Params = TypeVar("_Params", bound=Mapping[str, Any])


class Need(str, enum.Enum):
    """What a check needs to run; a missing need turns the check into a `skip` with the reason."""

    NVML = "nvml"  # a working NVML (or a recorded snapshot)
    GPU = "gpu"  # at least one GPU to compute on (or --device cpu)
    TORCH = "torch"
    CUPY = "cupy"
    ROOT = "root"
    MULTI_GPU = "multi-gpu"  # >= 2 GPUs (or >= 2 CPU workers)
    PEERS = "peers"  # other nodes
    KERNEL_LOG = "kernel-log"


# Needs without which a compute check cannot load this node's GPUs at all.
COMPUTE_NEEDS = (Need.GPU, Need.TORCH, Need.CUPY)
# Needs that say the check does not apply to this node's shape (one GPU, no peers), rather than
# that something it should have examined could not be.
SHAPE_NEEDS = (Need.MULTI_GPU, Need.PEERS)


@dataclass(frozen=True)
class Slice:
    """The least run time that gives a compute check a judgement (`seconds`), and what it is made
    of, for the message when the run's time limit leaves less (`what`)."""

    seconds: float
    what: str


@dataclass(frozen=True)
class CheckSpec:
    id: str
    title: str
    level: Level
    needs: tuple[Need, ...] = ()
    budget_s: float = 10.0
    detects: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)
    # What each default may be set to (gpucheck.core.config.Limit per key); a key not listed follows
    # gpucheck.core.config.conventional_limit. Validated by Config.validate_checks.
    limits: dict[str, Any] = field(default_factory=dict)
    injects: tuple[str, ...] = ()  # fault-injection kinds this check honours
    # Budget that depends on the run (a burn's --duration): budget_fn(ctx) -> seconds.
    budget_fn: Callable[["Context"], float] | None = None
    # Loads the GPUs (default: when it needs Need.GPU). The runner runs compute checks last.
    compute: bool | None = None
    # The least time a compute check needs to give a judgement on this run (start-up and the
    # duration its level promises): min_slice_fn(ctx) -> Slice. None: no minimum.
    min_slice_fn: Callable[["Context"], Slice] | None = None
    # The highest run level that changes what the check does (a burn is longer at 3 and 4);
    # None: only its own level. The verdict's level is the highest level a check ran at.
    top_level: Level | None = None
    # Why this check cannot examine anything on this run beyond its `needs` (CPU workers have no
    # power telemetry), or None: the runner skips it, and an --inject aimed at it is a usage error.
    unavailable_fn: Callable[["Context"], str | None] | None = None
    # The check's own options (gpucheck.core.options): a dataclass of option(...) fields, which its
    # command and `gpucheck run --option` build from; read with ctx.options_for(cls). None: none.
    options: type | None = None

    def budget(self, ctx: "Context") -> float:
        return float(self.budget_fn(ctx)) if self.budget_fn else float(self.budget_s)

    @property
    def is_compute(self) -> bool:
        return bool(self.compute) if self.compute is not None else Need.GPU in self.needs

    def min_slice(self, ctx: "Context") -> Slice:
        return self.min_slice_fn(ctx) if self.min_slice_fn else Slice(0.0, "no minimum")

    def run_level(self, run_level: int) -> int:
        """The level this check runs at in a run of `run_level`: its own level at least, and the
        run's level up to its `top_level`."""
        top = int(self.top_level or self.level)
        return max(int(self.level), min(int(run_level), top))


@dataclass(frozen=True)
class Check:
    spec: CheckSpec
    run: Callable[["Context"], list[Result]]

    @property
    def id(self) -> str:
        return self.spec.id


def define(
    id: str,
    *,
    title: str,
    level: Level | int,
    needs: tuple[Need, ...] | list[Need] = (),
    budget_s: float = 10.0,
    detects: str = "",
    defaults: Mapping[str, Any] | None = None,  # the check's TypedDict of parameters
    limits: dict[str, Any] | None = None,
    injects: tuple[str, ...] = (),
    budget_fn: Callable[["Context"], float] | None = None,
    compute: bool | None = None,
    min_slice_fn: Callable[["Context"], Slice] | None = None,
    top_level: Level | int | None = None,
    unavailable_fn: Callable[["Context"], str | None] | None = None,
    options: type | None = None,
) -> Callable[[Callable[["Context"], list[Result]]], Check]:
    """Decorator: turn a run function into a registered-by-module `Check`. `options`: the
    dataclass of the check's own options (TypeError when it is not one)."""
    if options is not None:
        declared(options)

    def wrap(fn: Callable[["Context"], list[Result]]) -> Check:
        return Check(
            CheckSpec(
                id=id,
                title=title,
                level=Level(level),
                needs=tuple(needs),
                budget_s=budget_s,
                detects=detects,
                defaults=dict(defaults or {}),
                limits=dict(limits or {}),
                injects=tuple(injects),
                budget_fn=budget_fn,
                compute=compute,
                min_slice_fn=min_slice_fn,
                top_level=None if top_level is None else Level(top_level),
                unavailable_fn=unavailable_fn,
                options=options,
            ),
            fn,
        )

    return wrap


@dataclass(frozen=True)
class RunOptions:
    """What a run passes to every check beyond the level, the GPUs and the device: facts about the
    run that no one check owns (None: not given). A check's own options (`gpucheck burn --size`)
    are its options dataclass (CheckSpec.options, read with ctx.options_for). Every field is named
    here; any other name is a programming error (RunOptions.of raises TypeError)."""

    # judging a recorded snapshot (--snapshot FILE): the core's needs (no live GPU to compute on),
    # the pipeline and the checks that read this node's live state (xid, eud.dcgm) all read it
    snapshot_path: str | None = None
    # the window's start the Slurm epilog passes (the job's start, "@EPOCH"): the xid check judges
    # from it, and the pipeline then leaves the last-pass cursor alone
    xid_since: str | float | None = None
    peers: Sequence[str] | None = None  # nodes a multi-node check may pair with (Need.PEERS)

    @classmethod
    def of(cls, given: "RunOptions | Mapping[str, Any] | None") -> "RunOptions":
        """RunOptions from a mapping of field names (a command's options); TypeError names a key
        that is not an option."""
        if given is None:
            return cls()
        if isinstance(given, RunOptions):
            return given
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in given if k not in names)
        if unknown:
            raise TypeError(f"unknown run option(s): {', '.join(unknown)} (options: {', '.join(sorted(names))}; "
                            "a check's own options are its options dataclass, Context.check_options)")
        return cls(**dict(given))

    def with_(self, **changes: Any) -> "RunOptions":
        return dataclasses.replace(self, **changes)


OptionsT = TypeVar("OptionsT")


def _live_telemetry() -> "TelemetrySource":
    from ..platform.telemetry.source import live  # lazy: a Context made for a replay never opens NVML

    return live()


@dataclass
class Context:
    """Everything a check may look at. Plain data and small services; no global state.

    snapshot: the telemetry snapshot (read once at the edge from `telemetry`: live NVML, or a
      recorded file replayed through the same reader); None when no selected check needs NVML.
      See docs/snapshot.md.
    telemetry: where this run's telemetry comes from (gpucheck.platform.telemetry.source): the snapshot was
      read from it, and the sampler (load telemetry, Xid events) and the busy guard (the GPUs'
      running processes) read it too. Chosen at the edge; default: this node's NVML.
    options: the run's options (RunOptions; a mapping of its field names is converted).
    check_options: the checks' own options a command gave (instances of the checks' options
      dataclasses, at most one per class); a check reads its own with `options_for(cls)`.
    gpus: the selected GPU indices (None = all).
    device: "cuda" or "cpu" for compute checks; workers: number of CPU workers standing in for GPUs.
    level: the run's level; checks that scale with the level (burn length) read it.
    deadline: when checks must have stopped working (the run's time limit less the time reserved
      to stop them and write the verdict); stop_s: how long a cancelled check has to stop.
    requested: the ids the user named (--check, or a per-check command such as `gpucheck burn`):
      a compute check among them that cannot run is unexamined, not a plain skip.
    """

    level: Level = Level.QUICK
    config: "Config | None" = None
    snapshot: "Snapshot | None" = None
    gpus: list[int] | None = None
    device: str = "auto"
    workers: int = 2
    injections: list["Injection"] = field(default_factory=list)
    state: "State | None" = None
    sysfs_root: Path = Path("/sys")
    deadline: float | None = None  # time.monotonic() by which checks stop working, if any
    stop_s: float = 5.0  # after cancel: how long a check has to stop its workers and return
    requested: frozenset[str] = frozenset()
    options: RunOptions = field(default_factory=RunOptions)
    check_options: tuple[Any, ...] = ()
    telemetry: "TelemetrySource" = field(default_factory=_live_telemetry)
    # Set by the runner on SIGTERM/SIGINT or the whole-run timeout: long checks poll it and
    # return what they have; worker pools stop their workers when it is set.
    cancel: threading.Event = field(default_factory=threading.Event)
    # Called by long checks with progress for the live display: progress(check_id, subject, dict).
    progress: Callable[[str, str, dict[str, Any]], None] | None = None
    # --force: load checks load GPUs that a job is using (gpucheck.workers.busy); the results say so.
    force: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.options, RunOptions):
            self.options = RunOptions.of(self.options)
        self.check_options = tuple(self.check_options)
        classes = [type(o) for o in self.check_options]
        for cls in classes:
            declared(cls)  # TypeError: not a check's options dataclass (a dict of names, a RunOptions)
        doubled = sorted({c.__name__ for c in classes if classes.count(c) > 1})
        if doubled:
            raise TypeError(f"check options given twice: {', '.join(doubled)}")

    def options_for(self, options_class: type[OptionsT]) -> OptionsT:
        """The options of `options_class` (a check's options dataclass) this run was given; the
        class's defaults (every option None: not given) when none were."""
        declared(options_class)
        for o in self.check_options:
            if type(o) is options_class:
                return o
        return options_class()

    def report(self, check_id: str, subject: str, info: dict[str, Any]) -> None:
        if self.progress is not None:
            try:
                self.progress(check_id, subject, info)
            except Exception:  # a display problem never breaks a check
                pass

    @overload
    def params(self, check: str, defaults: _Params) -> _Params: ...

    @overload
    def params(self, check: Check | CheckSpec | str, defaults: None = None) -> dict[str, Any]: ...

    def params(self, check: Check | CheckSpec | str, defaults: Mapping[str, Any] | None = None) -> Any:
        """The check's defaults merged with the config's overrides for it. Given the check's typed
        defaults (a TypedDict), of that type: the config holds only keys the check declares, each
        of its default's kind (gpucheck.core.config.Config.validate_checks)."""
        spec_defaults: Mapping[str, Any]
        if isinstance(check, Check):
            spec_defaults, cid = check.spec.defaults, check.spec.id
        elif isinstance(check, CheckSpec):
            spec_defaults, cid = check.defaults, check.id
        else:
            spec_defaults, cid = defaults or {}, check
        merged = dict(spec_defaults)
        if self.config is not None:
            merged.update(self.config.check_overrides(cid))
        return merged

    def injections_for(self, kind: str) -> list["Injection"]:
        return [i for i in self.injections if i.kind == kind]

    def selected_gpu_entries(self) -> "list[GpuEntry]":
        """Snapshot GPU entries restricted to the selection."""
        if not self.snapshot:
            return []
        entries = self.snapshot.get("gpus", [])
        if self.gpus is None:
            return list(entries)
        wanted = set(self.gpus)
        return [g for g in entries if g.get("index") in wanted]


def missing_need(need: Need, ctx: Context) -> str | None:
    """Why `need` is not met in `ctx`, or None when it is. Cheap: imports nothing heavy."""
    if need is Need.NVML:
        snap = ctx.snapshot
        if snap is None:
            return "no telemetry was read"
        return None  # NVML failures are judged by the checks themselves (inventory says why)
    if need is Need.TORCH:
        spec = importlib.util.find_spec("torch")
        if spec is None:
            return "PyTorch not installed (pip install 'gpucheck-cluster[torch]')"
        if ctx.device != "cpu" and not _torch_has_cuda(spec):
            return "PyTorch is a CPU-only build (no libtorch_cuda); install a CUDA build, or use --device cpu"
        return None
    if need is Need.CUPY:  # the CUDA kernels; CPU workers run their NumPy/torch stand-ins
        if ctx.device == "cpu" or importlib.util.find_spec("cupy"):
            return None
        return "CuPy not installed (pip install 'gpucheck-cluster[cupy]'; or --device cpu)"
    if need is Need.ROOT:
        return None if os.geteuid() == 0 else "needs root"
    if need is Need.GPU:
        if ctx.device == "cpu":
            return None
        if ctx.options.snapshot_path:
            return "judging a recorded snapshot (--snapshot): compute checks need this node's live GPUs"
        if _gpu_count(ctx) == 0:
            return "no usable GPU (use --device cpu to run the compute checks on the CPU)"
        return None
    if need is Need.MULTI_GPU:
        n = ctx.workers if ctx.device == "cpu" else _gpu_count(ctx)
        return None if n >= 2 else f"needs at least 2 GPUs, this node has {n}"
    if need is Need.PEERS:
        return None if ctx.options.peers else "needs peer nodes (use gpucheck nccl pairs / sweep)"
    return None


def unmet_needs(check: Check, ctx: Context) -> tuple[str | None, bool]:
    """Why `check` cannot run on this run (its unmet needs, then its `unavailable_fn`), or None;
    and whether the reason is that this node's GPUs cannot be computed on (COMPUTE_NEEDS)."""
    why, unmet = _unmet(check, ctx)
    return why, any(n in COMPUTE_NEEDS for n in unmet)


def does_not_apply(check: Check, ctx: Context) -> bool:
    """Whether `check` is skipped only because it does not apply to this node's shape (one GPU
    where it needs two, no peer nodes): nothing here that it should have examined."""
    why, unmet = _unmet(check, ctx)
    return why is not None and bool(unmet) and all(n in SHAPE_NEEDS for n in unmet)


def _unmet(check: Check, ctx: Context) -> tuple[str | None, list[Need | None]]:
    needs = list(check.spec.needs)
    if Need.GPU in needs:  # judging a recorded snapshot: "not this node" is the whole reason
        needs.remove(Need.GPU)
        needs.insert(0, Need.GPU)
    reasons: list[str] = []
    unmet: list[Need | None] = []
    for n in needs:
        r = missing_need(n, ctx)
        if r and n is Need.GPU and ctx.options.snapshot_path:
            return r, [n]
        if r:
            reasons.append(r)
            unmet.append(n)
    if not reasons and check.spec.unavailable_fn is not None:
        why = check.spec.unavailable_fn(ctx)
        if why:
            reasons.append(why)
            unmet.append(None)
    return ("; ".join(reasons) if reasons else None), unmet


def must_examine(ctx: Context, check_id: str) -> bool:
    """Whether this run was asked to compute on this node's GPUs with `check_id`: the user named
    the check or the device (--device cuda or cpu), or NVML shows usable GPUs here (a GPU node
    whose torch is a CPU-only build is not healthy by default). Only `--device auto` on a node
    without a usable GPU (or judging a recorded snapshot) leaves a compute check a plain skip."""
    if check_id in ctx.requested or ctx.device in ("cuda", "cpu"):
        return True
    if ctx.options.snapshot_path:
        return False
    return _gpu_count(ctx) > 0


def compute_skip(ctx: Context, check_id: str, why: str, **kw: Any) -> Result:
    """A skip of a compute check that could not load the GPUs (no GPU, no CUDA torch, no CuPy):
    `unexamined` (the run exits 3) when the run was asked to examine them (must_examine)."""
    return Result(check_id, Status.SKIP, why, unexamined=must_examine(ctx, check_id), **kw)


def _torch_has_cuda(spec) -> bool:
    """Whether the installed torch is a CUDA build, without importing it (a level-1 run must not
    pay for torch): CUDA builds ship libtorch_cuda next to libtorch."""
    for root in spec.submodule_search_locations or []:
        lib = os.path.join(root, "lib")
        try:
            names = os.listdir(lib)
        except OSError:
            continue
        if any(n.startswith("libtorch_cuda") for n in names):
            return True
    return False


def _gpu_count(ctx: Context) -> int:
    if ctx.snapshot is None:
        return 0
    return len([g for g in ctx.selected_gpu_entries() if g.get("state", "ok") == "ok"])
