"""The check contract: what a diagnostic declares, and what it is handed when it runs.

A check is a `Check`: a `CheckSpec` (id, description, level, needs, budget, defaults) and a run
function `run(ctx) -> list[Result]`. It never prints and never exits. Thresholds are data: every
check declares its defaults in `spec.defaults` (and, where the convention of
gpucheck.config.conventional_limit does not fit, what each may be set to in `spec.limits`); a
site's config overrides them per check, and the merged values reach the check as
`ctx.params(check_id)`.
"""

from __future__ import annotations

import enum
import importlib.util
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .result import Result

if TYPE_CHECKING:  # pragma: no cover
    from .config import Config
    from .inject import Injection
    from .state import State


class Level(enum.IntEnum):
    QUICK = 1
    STANDARD = 2
    EXTENDED = 3
    BURN_IN = 4

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, text: str | int) -> "Level":
        s = str(text).strip().lower()
        if s.isdigit() and int(s) in {lv.value for lv in cls}:
            return cls(int(s))
        for lv in cls:
            if s == lv.label or s == lv.name.lower():
                return lv
        raise ValueError(
            f"unknown level {text!r}: use 1-4 or one of "
            + ", ".join(lv.label for lv in cls)
        )


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


@dataclass(frozen=True)
class CheckSpec:
    id: str
    title: str
    level: Level
    needs: tuple[Need, ...] = ()
    budget_s: float = 10.0
    detects: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)
    # What each default may be set to (gpucheck.config.Limit per key); a key not listed follows
    # gpucheck.config.conventional_limit. Validated by Config.validate_checks.
    limits: dict[str, Any] = field(default_factory=dict)
    injects: tuple[str, ...] = ()  # fault-injection kinds this check honours
    # Budget that depends on the run (a burn's --duration): budget_fn(ctx) -> seconds.
    budget_fn: Callable[["Context"], float] | None = None

    def budget(self, ctx: "Context") -> float:
        return float(self.budget_fn(ctx)) if self.budget_fn else float(self.budget_s)


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
    defaults: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
    injects: tuple[str, ...] = (),
    budget_fn: Callable[["Context"], float] | None = None,
) -> Callable[[Callable[["Context"], list[Result]]], Check]:
    """Decorator: turn a run function into a registered-by-module `Check`."""

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
            ),
            fn,
        )

    return wrap


@dataclass
class Context:
    """Everything a check may look at. Plain data and small services; no global state.

    snapshot: the telemetry snapshot (live NVML read once by the runner, or a recorded file); None
      when no selected check needs NVML. See docs/snapshot.md.
    gpus: the selected GPU indices (None = all).
    device: "cuda" or "cpu" for compute checks; workers: number of CPU workers standing in for GPUs.
    level: the run's level; checks that scale with the level (burn length) read it.
    """

    level: Level = Level.QUICK
    config: "Config | None" = None
    snapshot: dict[str, Any] | None = None
    gpus: list[int] | None = None
    device: str = "auto"
    workers: int = 2
    injections: list["Injection"] = field(default_factory=list)
    state: "State | None" = None
    sysfs_root: Path = Path("/sys")
    deadline: float | None = None  # time.monotonic() deadline of the whole run, if any
    options: dict[str, Any] = field(default_factory=dict)  # per-command extras (durations, dtypes)
    # Set by the runner on SIGTERM/SIGINT or the whole-run timeout: long checks poll it and
    # return what they have; worker pools stop their workers when it is set.
    cancel: threading.Event = field(default_factory=threading.Event)
    # Called by long checks with progress for the live display: progress(check_id, subject, dict).
    progress: Callable[[str, str, dict[str, Any]], None] | None = None
    # --force: load checks load GPUs that a job is using (gpucheck.busy); the results say so.
    force: bool = False

    def report(self, check_id: str, subject: str, info: dict[str, Any]) -> None:
        if self.progress is not None:
            try:
                self.progress(check_id, subject, info)
            except Exception:  # a display problem never breaks a check
                pass

    def params(self, check: Check | CheckSpec | str, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
        """The check's defaults merged with the config's overrides for it."""
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

    def selected_gpu_entries(self) -> list[dict[str, Any]]:
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
            return "PyTorch not installed (pip install 'gpucheck[torch]')"
        if ctx.device != "cpu" and not _torch_has_cuda(spec):
            return "PyTorch is a CPU-only build (no libtorch_cuda); install a CUDA build, or use --device cpu"
        return None
    if need is Need.CUPY:
        return None if importlib.util.find_spec("cupy") else "CuPy not installed (pip install 'gpucheck[cupy]')"
    if need is Need.ROOT:
        return None if os.geteuid() == 0 else "needs root"
    if need is Need.GPU:
        if ctx.device == "cpu":
            return None
        if ctx.options.get("snapshot_path"):
            return "judging a recorded snapshot (--snapshot): compute checks need this node's live GPUs"
        if _gpu_count(ctx) == 0:
            return "no usable GPU (use --device cpu to run the compute checks on the CPU)"
        return None
    if need is Need.MULTI_GPU:
        n = ctx.workers if ctx.device == "cpu" else _gpu_count(ctx)
        return None if n >= 2 else f"needs at least 2 GPUs, this node has {n}"
    if need is Need.PEERS:
        return None if ctx.options.get("peers") else "needs peer nodes (use gpucheck nccl pairs / sweep)"
    return None


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
