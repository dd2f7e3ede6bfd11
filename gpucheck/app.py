"""The run pipeline shared by `gpucheck run` and the per-check commands (`burn`, ...).

config -> selection -> telemetry (live NVML or a snapshot file) -> runner -> verdict -> outputs
(stdout table or JSON, --output, --prom, history, last-pass cursor) -> exit code.

Usage problems (bad level, unknown check, --gpus naming a GPU that NVML does not list (a user's
typo: not a Slurm job's GPUs, which the inventory check judges), a file that is not a
snapshot, an output path that cannot be written, an unsafe state directory, an --inject that no
check can honour on this run) raise UsageError before any check runs: exit 2, one line. Once the
checks have run, outputs never mask the verdict: a write that fails then is a loud warning and the
verdict's exit code stands.

The run's clock starts when SIGTERM/SIGINT are armed (gpucheck.platform.interrupts: the command's first
line, or the start of `execute`); --timeout counts from there, telemetry reading included, and
the handlers stay until every output is written. A signal before the verdict is final makes it
partial (exit 3, or 1 when a fail was judged); one that arrives while it is written changes
nothing: the outputs are finished and the exit code is the verdict's.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .core.check import Check, Context, Need, RunOptions, unmet_needs
from .core.config import Config, ConfigError, load_config
from .core.inject import Injection, InjectionError, parse_injection
from .core.jsonvalue import JsonValue
from .core.levels import Level
from .core.result import Status
from .core.selection import SelectionError, select
from .core.state import State, default_state_dir
from .core.verdict import (EXIT_USAGE, CheckEntry, RunFacts, Verdict, VerdictSource, build_verdict, gpu_inventory,
                           node_host, verdict_level)
from .platform.interrupts import INTERRUPTS, Interrupts
from .platform.messages import say_error
from .platform.safeio import check_output, describe_error, output_problem
from .tests_suite.registry import all_checks

if TYPE_CHECKING:  # pragma: no cover
    from .core.runner import Outcome
    from .platform.telemetry.model import Snapshot
    from .platform.telemetry.source import TelemetrySource

LIVE_TELEMETRY_TIMEOUT_S = 30.0  # without a time limit: NVML not answering within this is hung
# With a time limit: what reading NVML leaves (at most half of the checks' time) to the read-only
# checks that do not read NVML (xid, the kernel log), so that a hung driver never starves them.
KERNEL_LOG_RESERVE_S = 2.0


class UsageError(Exception):
    """A problem with what the user asked for: exit 2 with this one-line message."""


@dataclass
class RunRequest:
    level: Level | int | str | None = None
    check_patterns: list[str] = field(default_factory=list)
    skip_patterns: list[str] = field(default_factory=list)
    gpus: list[int] | None = None
    # The GPUs were given by the scheduler (a Slurm hook: SLURM_JOB_GPUS), not typed by a user: one
    # that NVML does not list is judged missing by the inventory check (a fault), not a usage error.
    gpus_assigned: bool = False
    device: str = "auto"
    workers: int = 2
    injections: list[str] = field(default_factory=list)
    options: RunOptions | Mapping[str, Any] = field(default_factory=dict)  # RunOptions' fields
    # The checks' own options (instances of their options dataclasses: gpucheck.core.options).
    check_options: tuple[Any, ...] = ()
    json: bool = False
    output: str | None = None
    prom: str | None = None
    strict: bool | None = None
    on_error: str | None = None
    config_path: str | None = None
    snapshot_path: str | None = None
    state_dir: str | None = None
    timeout_s: float | None = None
    history: bool = True
    force: bool = False  # load GPUs that are in use (gpucheck.workers.busy)
    # Where telemetry comes from; None: a replay of `snapshot_path`, else this node's NVML.
    telemetry: "TelemetrySource | None" = None
    verbose: bool = False  # the full table (one row per result) instead of the grid


@dataclass
class Prepared:
    """Everything decided before the first check runs."""

    config: Config
    level: Level
    checks: list[Check]
    ctx: Context
    strict: bool
    on_error: str
    timeout_s: float | None
    source_kind: str
    snapshot_path: str | None
    injections: list[Injection]
    started: float = 0.0  # time.monotonic() when the run began: --timeout counts from here


MAX_GPU_INDEX = 1023  # NVML numbers GPUs from 0; no node has a thousand of them
MAX_WORKERS = MAX_GPU_INDEX + 1  # CPU workers stand in for GPUs: as many as GPUs can be named


def parse_gpu_list(text: str | None) -> list[int] | None:
    """'0,3' / '0-3,6' / 'all' -> indices; UsageError on anything else.

    Every index is between 0 and MAX_GPU_INDEX, checked before a range is expanded, and the
    list has at most MAX_GPU_INDEX + 1 entries: `0-99999999` is refused at once."""
    if text is None or text.strip() in ("", "all"):
        return None
    parts = text.split(",")
    if len(parts) > MAX_GPU_INDEX + 1:
        raise UsageError(f"--gpus: bad GPU list: {len(parts)} entries (at most {MAX_GPU_INDEX + 1})")
    out: set[int] = set()
    for part in parts:
        lo, dash, hi = part.strip().partition("-")
        try:
            a = int(lo)
            b = int(hi) if dash else a
        except ValueError:
            raise UsageError(f"--gpus: bad GPU list {_gpu_text(text)} (want e.g. 0,3 or 0-3)") from None
        if a < 0 or b < a:
            raise UsageError(f"--gpus: bad GPU list {_gpu_text(text)}")
        if b > MAX_GPU_INDEX:
            raise UsageError(f"--gpus: bad GPU list {_gpu_text(text)}: GPU index {b} is above {MAX_GPU_INDEX}")
        out.update(range(a, b + 1))
    return sorted(out)


def _gpu_text(text: str, limit: int = 80) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def _check_writable(path: str, what: str) -> None:
    """UsageError when `path` cannot be an output (gpucheck.platform.safeio: a regular file or a new name
    in an existing writable folder, a FIFO, /dev/null, a terminal; a symlink only when trusted)."""
    try:
        check_output(path)
    except OSError as e:
        raise UsageError(f"{what} {path}: {_output_problem(e, path)}") from None


def _output_problem(e: OSError, path: str) -> str:
    return output_problem(e, path)


def telemetry_wait(checks: list[Check], until: float | None, now: float | None = None) -> float:
    """How long the run waits for NVML to answer: LIVE_TELEMETRY_TIMEOUT_S, and with a time limit
    (`until`, time.monotonic(): when checks must stop) no more than it leaves, less a reserve
    (KERNEL_LOG_RESERVE_S, at most half of what is left) for the read-only checks that do not read
    NVML (`xid`: the kernel log), so that a hung driver never starves them of the run's time."""
    if until is None:
        return LIVE_TELEMETRY_TIMEOUT_S
    left = until - (time.monotonic() if now is None else now)
    others = any(not c.spec.is_compute and Need.NVML not in c.spec.needs for c in checks)
    reserve = min(KERNEL_LOG_RESERVE_S, 0.5 * left) if others else 0.0
    return max(0.0, min(LIVE_TELEMETRY_TIMEOUT_S, left - reserve))


def _collect_live(source: "TelemetrySource", timeout_s: float, *, interrupts: Interrupts | None = None,
                  limited: bool = False) -> "Snapshot":
    """Read the source's snapshot in a daemon thread so that a hung driver cannot hang the gate
    (the thread stuck in the driver cannot be killed: as a daemon it cannot hold the process's
    exit either, and the source's NVML is abandoned: not shut down at exit while it is stuck).

    - NVML that does not answer within `timeout_s` (`limited`: all that the run's time limit
      leaves it, telemetry_wait, less than the hang limit) gives a snapshot of kind "timeout":
      the NVML checks are `error` (could not judge), and the run goes on to the checks that do
      not need NVML (xid). Not answering within the whole hang limit (LIVE_TELEMETRY_TIMEOUT_S)
      is kind "hung": a hung driver, judged by the inventory check (GPUs on the bus: fail).
    - An exception out of the reader: NVML's own failure (pynvml's NVMLError, no library) is
      classified and judged like any NVML failure (the inventory check); anything else is a bug in
      gpucheck's reader: kind "internal_error", an `error` of the NVML checks naming it, never a
      fault of the node.
    - A signal only stops the wait: the runner then runs no check, so nothing is judged from the
      unread snapshot."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["snap"] = source.snapshot()
        except Exception as e:  # noqa: BLE001 - classified below: NVML's failure or our own bug
            box["err"] = e
        finally:
            done.set()

    th = threading.Thread(target=target, name="telemetry", daemon=True)
    th.start()
    hung_at = time.monotonic() + timeout_s
    while not done.wait(min(0.05, max(0.0, hung_at - time.monotonic()))):
        if interrupts is not None and interrupts.reason:
            return source.unread("other", f"NVML not read: interrupted by {interrupts.reason}")
        if time.monotonic() >= hung_at:
            return _unanswered(source, th, timeout_s, limited)
    if "err" in box:
        return _failed_read(source, box["err"])
    snap: Snapshot = box["snap"]
    return snap


def _unanswered(source: "TelemetrySource", thread: threading.Thread, timeout_s: float, limited: bool
                ) -> "Snapshot":
    """The snapshot of a read left behind in the driver (by `thread`): kind "timeout", the source
    abandoned (its NVML not shut down at exit while the thread is stuck)."""
    from .platform.telemetry import nvml as N

    abandon = getattr(source, "abandon", None)
    if abandon is not None:
        abandon(thread)
    if limited and timeout_s < 0.05:
        return source.unread(N.TIMEOUT, "NVML not read: the run's time limit leaves it no time")
    if limited:  # less than the hang limit: a slow driver is no fault, the NVML checks could not judge
        return source.unread(N.TIMEOUT, f"NVML did not answer within {round(timeout_s, 1):g} s "
                                        "(all the run's time limit leaves it)")
    return source.unread(N.HUNG, f"NVML did not answer within {round(timeout_s, 1):g} s, the hang limit: "
                                 "the driver is hung")


def _failed_read(source: "TelemetrySource", e: Exception) -> "Snapshot":
    """The snapshot of a read that raised `e` (see _collect_live)."""
    import traceback

    from .platform.telemetry import nvml as N

    if N.is_nvml_failure(e):
        failure = N.classify(e)
        return source.unread(failure.kind, f"reading telemetry failed: {failure.message}")
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    text = " ".join(f"{type(e).__name__}: {e}".split())[:300]
    return source.unread(N.INTERNAL_ERROR, f"gpucheck's own telemetry reader failed ({text}{where}); "
                                           "a bug in gpucheck, not a fault of the node")


def _tested_units(ctx: Context) -> tuple[list[int], str]:
    """The GPU indices (or CPU workers) compute checks start workers on in this run."""
    if ctx.device == "cpu":
        return [i for i in range(ctx.workers) if ctx.gpus is None or i in ctx.gpus], "CPU worker"
    return sorted(int(g["index"]) for g in ctx.selected_gpu_entries() if g.get("state", "ok") == "ok"), "GPU"


def _injection_kinds(injections: list[Injection], checks: list[Check], catalog: list[Check]) -> None:
    """UsageError for an --inject whose kind no selected check honours."""
    for inj in injections:
        if not any(inj.kind in c.spec.injects for c in checks):
            kinds = sorted({k for c in catalog for k in c.spec.injects}) or ["none"]
            raise UsageError(f"--inject {inj.text}: no selected check honours {inj.kind!r} (kinds: {', '.join(kinds)})")


def check_injections(injections: list[Injection], checks: list[Check], ctx: Context) -> None:
    """UsageError for an --inject that no selected check can honour on this run: every check of
    its kind is skipped here (unmet needs: a replayed snapshot, no GPU, no torch, CPU workers
    without telemetry), or its `gpu=` is not tested (--workers, --gpus, this node's GPUs)."""
    for inj in injections:
        honouring = [c for c in checks if inj.kind in c.spec.injects]
        blocked = {c.id: unmet_needs(c, ctx)[0] for c in honouring}
        if all(blocked.values()):
            why = "; ".join(f"{cid}: {r}" for cid, r in blocked.items())
            raise UsageError(f"--inject {inj.text}: no check that honours {inj.kind!r} can run here ({why})")
        gpu = inj.get("gpu")
        if gpu is None:
            continue
        tested, unit = _tested_units(ctx)
        if not isinstance(gpu, int):
            raise UsageError(f"--inject {inj.text}: gpu must be an index, not {gpu!r}")
        if gpu not in tested:
            have = ",".join(map(str, tested)) or "none"
            raise UsageError(f"--inject {inj.text}: no {unit} {gpu} is tested on this run ({unit}s tested: {have})")


def prepare(req: RunRequest, *, started: float | None = None, interrupts: Interrupts | None = None) -> Prepared:
    """Everything decided before the first check runs (UsageError: exit 2). `started`
    (time.monotonic()) is when the run began: telemetry reading stops at the time limit."""
    started = time.monotonic() if started is None else started
    config, level, catalog, checks = _select(req)
    strict = bool(config.run.get("strict", False)) if req.strict is None else req.strict
    on_error = req.on_error or config.run.get("on_error", "pass")
    if on_error not in ("pass", "fail"):
        raise UsageError(f"--on-error: must be pass or fail, not {on_error!r}")
    timeout_s = req.timeout_s if req.timeout_s is not None else config.run.get("timeout")
    if timeout_s is not None and timeout_s <= 0:
        raise UsageError("--timeout must be positive")
    if req.device not in ("auto", "cuda", "cpu"):
        raise UsageError(f"--device: must be auto, cuda or cpu, not {req.device!r}")
    if not 1 <= req.workers <= MAX_WORKERS:
        raise UsageError(f"--workers must be between 1 and {MAX_WORKERS}, not {req.workers}")
    try:
        injections = [parse_injection(t) for t in req.injections]
    except InjectionError as e:
        raise UsageError(f"--inject: {e}") from None
    _injection_kinds(injections, checks, catalog)

    for path, what in ((req.output, "--output"), (req.prom, "--prom")):
        if path and path != "-":
            _check_writable(path, what)

    until = None
    if timeout_s is not None:
        from .core.runner import limits

        until = limits(started, timeout_s).deadline
    telemetry, snapshot, source_kind = _telemetry(req, checks, until, interrupts)
    _check_gpus(req, snapshot)
    gpus = _run_gpus(req, snapshot)

    state: State | None = None
    explicit_state = req.state_dir or config.run.get("state_dir")
    if req.history and (explicit_state or not req.snapshot_path):
        # A replayed snapshot is another node's past: keep it out of this node's history unless
        # a state directory was named on purpose.
        state = State(explicit_state or default_state_dir(), host=node_host(snapshot, source_kind))
        try:
            state.check()
        except OSError as e:
            raise UsageError(f"state directory {state.root}: {describe_error(e, str(state.root))}") from None

    options = RunOptions.of(req.options)
    if req.snapshot_path:
        options = options.with_(snapshot_path=req.snapshot_path)
    ctx = Context(
        level=level,
        config=config,
        snapshot=snapshot,
        gpus=gpus,
        device=req.device,
        workers=req.workers,
        injections=injections,
        state=state,
        options=options,
        check_options=req.check_options,
        telemetry=telemetry,
        requested=frozenset(c.id for c in checks) if req.check_patterns else frozenset(),
        force=req.force,
    )
    check_injections(injections, checks, ctx)
    return Prepared(config, level, checks, ctx, strict, on_error, timeout_s, source_kind,
                    req.snapshot_path, injections, started)


def _select(req: RunRequest) -> tuple[Config, Level, list[Check], list[Check]]:
    """The config, the run's level, the catalog the names were resolved against, the checks."""
    try:
        config = load_config(req.config_path)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    level_text = req.level if req.level is not None else config.run.get("level", 1)
    try:
        level = Level.parse(level_text)
    except ValueError as e:
        raise UsageError(str(e)) from None
    # Import only the check modules this run can use, unless names must be resolved against the
    # whole catalog (explicit --check/--skip patterns, [checks.*] tables in the config).
    skips = [*req.skip_patterns, *config.run.get("skip", [])]
    whole = bool(req.check_patterns or skips or config.checks)
    catalog = all_checks(max_level=None if whole else int(level))
    try:
        config.validate_checks(c.spec for c in catalog)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    try:
        checks = select(catalog, level, req.check_patterns, skips)
    except SelectionError as e:
        raise UsageError(str(e)) from None
    if not checks:
        raise UsageError("no check selected (everything was skipped)")
    return config, level, catalog, checks


def _telemetry(req: RunRequest, checks: list[Check], until: float | None, interrupts: Interrupts | None
               ) -> tuple["TelemetrySource", "Snapshot | None", str]:
    """The run's telemetry source (chosen here: the request's, a replay of the --snapshot file, or
    this node's NVML), the snapshot the checks judge (read from it, or none when no selected
    check needs it), and the verdict's source kind."""
    source = req.telemetry
    if source is None and req.snapshot_path:
        from .platform.telemetry.snapshot import SnapshotError, load_snapshot
        from .platform.telemetry.source import CaptureTelemetry, ReplayTelemetry, is_capture

        try:
            snap = load_snapshot(req.snapshot_path)
        except SnapshotError as e:
            raise UsageError(str(e)) from None
        where = "standard input" if req.snapshot_path == "-" else req.snapshot_path
        capture = snap.get("capture")  # an nvidia-smi capture
        for warning in (capture.get("warnings") if isinstance(capture, dict) else None) or []:
            _warn(f"{where}: {warning}", None)
        source = CaptureTelemetry(snap) if is_capture(snap) else ReplayTelemetry(snap)
    if source is None:
        from .platform.telemetry.source import LiveTelemetry

        source = LiveTelemetry()
    if source.kind == "replay" or req.device != "cpu" or any(Need.NVML in c.spec.needs for c in checks):
        wait_s = telemetry_wait(checks, until)
        snap = _collect_live(source, wait_s, interrupts=interrupts, limited=wait_s < LIVE_TELEMETRY_TIMEOUT_S)
        return source, snap, source.verdict_kind
    return source, None, "none"


def _run_gpus(req: RunRequest, snapshot: "Snapshot | None") -> list[int] | None:
    """The GPUs the run tests: --gpus, except scheduler-given indices on a node with MIG enabled
    on a GPU. There Slurm's GRES indices count MIG instances, not the GPUs NVML numbers (a job's
    `SLURM_JOB_GPUS=12` on a node of 8 GPUs split in 7): they name no GPU this run could test, so
    every GPU is tested (said on stderr), never a GPU judged missing for an index that was never
    one."""
    if req.gpus is None or not req.gpus_assigned or req.device == "cpu":
        return req.gpus
    gpus = (snapshot.get("gpus") if snapshot else None) or []
    mig = [g.get("index") for g in gpus if ((g.get("mig_mode") or {}).get("current")) is True]
    unknown = [g.get("index") for g in gpus if "mig_mode" in (g.get("errors") or {})]
    if not mig and not unknown:
        return req.gpus
    where = (f"MIG is enabled on GPU {','.join(map(str, mig))}" if mig else
             f"whether MIG is enabled could not be read on GPU {','.join(map(str, unknown))}")
    _warn(f"gpucheck: {where}: the scheduler's GPU indices ({','.join(map(str, req.gpus))}) may count MIG "
          "instances, not GPUs; testing every GPU", None)
    return None


def _check_gpus(req: RunRequest, snapshot: "Snapshot | None") -> None:
    """UsageError when --gpus names a GPU (or CPU worker) this run does not have: a user's typo
    (`--gpus 9` on an 8-GPU node). Not when NVML could not be read (which GPUs exist is unknown:
    the NVML checks judge that), nor for GPUs the scheduler assigned (`gpus_assigned`): a job's
    GPU that NVML does not list is gone, and the inventory check fails the node for it."""
    if req.gpus is None:
        return
    if req.device == "cpu":
        known = list(range(req.workers))
        unit = "CPU worker"
    else:
        nvml = snapshot.get("nvml") if snapshot else None
        if req.gpus_assigned or (nvml and not nvml.get("ok", True)):
            return
        known = sorted(int(g["index"]) for g in (snapshot.get("gpus", []) if snapshot else []))
        unit = "GPU"
    missing = [g for g in req.gpus if g not in known]
    if missing:
        have = ",".join(map(str, known)) if known else "none"
        raise UsageError(f"--gpus: no {unit} {','.join(map(str, missing))} on this node ({unit}s: {have})")


def execute(
    req: RunRequest,
    *,
    progress: Callable[[str, str, dict[str, Any]], None] | None = None,
    display_factory: Callable[[], Any] | None = None,
    on_verdict: Callable[[Verdict], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> int:
    """Run the pipeline; print the table (or JSON); write outputs; return the exit code.

    `on_verdict(verdict)` receives the verdict as soon as it is built, before any output is
    written (the Slurm hooks judge from it, so that no output step can mask it).

    Outputs never mask the verdict: a failed --output/--prom/history/cursor write is a warning on
    stderr (and passed to `on_warning`, e.g. a hook's syslog) and the verdict's exit code stands.

    On a terminal (and not --json) a live display shows progress: `display_factory()` builds it
    (an object with started(check), progress(check_id, subject, info), finished(run), close()),
    by default a one-line status (gpucheck.render.live.LiveStatus). Without a terminal (and not
    --json) progress lines go to stderr (gpucheck.render.progress.ProgressLines).

    SIGTERM/SIGINT are recorded (gpucheck.platform.interrupts) from here, or from the command's first
    line, until the last output is written; handlers armed here are restored on return.
    """
    armed_here = INTERRUPTS.arm()
    try:
        return _execute(req, progress, display_factory, on_verdict, on_warning)
    finally:
        INTERRUPTS.release()
        if armed_here:
            INTERRUPTS.disarm()


def _run(prep: Prepared, req: RunRequest, progress: Callable[[str, str, dict[str, Any]], None] | None,
         display_factory: Callable[[], Any] | None) -> "Outcome":
    """The checks, with the live display on a terminal; no worker process outlives them."""
    from .core.runner import run_checks

    display = None
    if not req.json and sys.stdout.isatty():
        if display_factory is None:
            from .render.live import LiveStatus

            display_factory = LiveStatus
        display = display_factory()
        prep.ctx.progress = progress or display.progress
    elif not req.json:  # cron, Slurm, ssh: a progress line per GPU at least every 10 s, on stderr
        from .render.progress import ProgressLines

        display = ProgressLines(sys.stderr)
        prep.ctx.progress = progress or display.progress
    elif progress is not None:
        prep.ctx.progress = progress

    try:
        outcome = run_checks(
            prep.checks,
            prep.ctx,
            timeout_s=prep.timeout_s,
            started=prep.started,
            interrupts=INTERRUPTS,
            on_start=display.started if display else None,
            on_done=display.finished if display else None,
        )
    finally:
        if display:
            display.close()
    if outcome.abandoned:
        _stop_leftover_workers()
    return outcome


def _stop_leftover_workers() -> None:
    """SIGKILL the worker processes of a check that did not stop in time (its thread was left
    behind): none may outlive the run, and none may hold the interpreter's exit."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return
    for proc in mp.active_children():
        try:
            proc.kill()
        except (OSError, ValueError, AttributeError):
            pass


def _judge(prep: Prepared, outcome: "Outcome", interrupted: str | None) -> Verdict:
    from .platform.fingerprint import software_fingerprint

    ran = [r.run_level for r in outcome.runs if r.ran]
    snapshot = prep.ctx.snapshot
    return build_verdict(outcome.results, RunFacts(
        level=verdict_level(ran, prep.level, [int(c.spec.level) for c in prep.checks]),
        started_at=outcome.started_at,
        duration_s=outcome.duration_s,
        checks=tuple(CheckEntry.of(r.check_id, r.level, r.status, r.duration_s) for r in outcome.runs),
        software=software_fingerprint(snapshot),
        host=node_host(snapshot, prep.source_kind),
        gpus=gpu_inventory(snapshot),
        source=VerdictSource.of(prep.source_kind, prep.snapshot_path, snapshot),
        interrupted=interrupted,
        injected=tuple(i.text for i in prep.injections),
        strict=prep.strict,
        on_error=prep.on_error,
    ))


def _execute(req: RunRequest, progress: Callable[[str, str, dict[str, Any]], None] | None,
             display_factory: Callable[[], Any] | None,
             on_verdict: Callable[[Verdict], None] | None = None,
             on_warning: Callable[[str], None] | None = None) -> int:
    try:
        prep = prepare(req, started=INTERRUPTS.armed_at, interrupts=INTERRUPTS)
    except UsageError as e:
        say_error(str(e))
        return EXIT_USAGE

    outcome = _run(prep, req, progress, display_factory)
    # A signal that arrived after the checks, or while the verdict was built, still makes it
    # partial; from here on the verdict is final and every output is written whole (signals are
    # held until execute returns).
    verdict = _judge(prep, outcome, outcome.interrupted or INTERRUPTS.reason)
    INTERRUPTS.hold()
    if INTERRUPTS.reason and not verdict.partial:
        verdict = _judge(prep, outcome, INTERRUPTS.reason)
    code = verdict.exit_code
    if on_verdict is not None:
        on_verdict(verdict)

    doc = verdict.to_json()
    text = json.dumps(doc, indent=2, sort_keys=False) + "\n"

    def warn(message: str) -> None:
        _warn(message, on_warning)

    _print(req, verdict, text, warn)
    _write_outputs(req, verdict, text, warn)
    if prep.ctx.state is not None:
        _record(prep, verdict, doc, outcome.started_at, warn)
    return code


def _print(req: RunRequest, verdict: Verdict, text: str, warn: Callable[[str], None]) -> None:
    """The verdict on stdout: its JSON (`text`) or the table. Printing that fails (a closed pipe,
    stdout on a full disk, a stdout that cannot encode the table, a bug in the table) is a
    warning, what is left unwritten is dropped, and the verdict's exit code stands."""
    from .platform.streams import flush_or_discard

    try:
        if req.json:
            sys.stdout.write(text)
        else:
            from .render.terminal import print_verdict

            print_verdict(verdict, verbose=req.verbose)
        sys.stdout.flush()
    except Exception as e:
        flush_or_discard(sys.stdout)  # stdout itself failed: what it still holds goes nowhere
        warn(f"the verdict was not printed on stdout: {type(e).__name__}: {e}; "
             f"{_stands(verdict)}")


def _warn(message: str, on_warning: Callable[[str], None] | None) -> None:
    """A loud warning: stderr, and the caller's sink (a hook logs it to syslog)."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    print(f"gpucheck: WARNING: {message}", file=sys.stderr, flush=True)
    if on_warning is not None:
        try:
            on_warning(message)
        except Exception:  # a broken sink must not turn the verdict into a crash
            pass


def _stands(verdict: Verdict) -> str:
    return f"the verdict stands ({verdict.status.value}, exit {verdict.exit_code})"


def _write_outputs(req: RunRequest, verdict: Verdict, text: str, warn: Callable[[str], None]) -> None:
    """--output and --prom ("-" is stdout). A write that fails is a warning; the verdict stands."""
    from .render.prom import render
    from .platform.safeio import write_output

    stands = _stands(verdict)
    for what, path, make in (("--output", req.output, lambda: text), ("--prom", req.prom, lambda: render(verdict))):
        if not path:
            continue
        try:
            body = make()
            if path == "-":
                if not (what == "--output" and req.json):
                    sys.stdout.write(body)
                    sys.stdout.flush()
            else:
                write_output(path, body)
        except OSError as e:
            warn(f"{what} {path} was not written: {_output_problem(e, path)}; {stands}")
        except Exception as e:  # a bug in rendering must not mask the verdict either
            warn(f"{what} {path} was not written: {type(e).__name__}: {e}; {stands}")


def _record(prep: Prepared, verdict: Verdict, doc: Mapping[str, JsonValue], started_at: float,
            warn: Callable[[str], None]) -> None:
    """The history (the verdict's document `doc`), and after a pass of the xid check its last-pass cursor."""
    state = prep.ctx.state
    assert state is not None
    if state.skipped_lines:
        warn(f"history in {state.root}: {state.skipped_lines} torn or unreadable line(s) skipped "
             f"({'; '.join(state.skipped_notes[:3])})")
    stands = _stands(verdict)
    try:
        state.append_history(doc)
    except OSError as e:
        warn(f"cannot write the history in {state.root}: {describe_error(e, str(state.root))}; {stands}")
        return
    xid_ok = any(c.id == "xid" and c.status in (Status.PASS, Status.WARN) for c in verdict.checks)
    if verdict.exit_code == 0 and not verdict.partial and xid_ok and prep.source_kind != "snapshot":
        try:
            _advance_last_pass(prep, state, verdict.time, started_at)
        except OSError as e:
            warn(f"cannot move the last-pass cursor in {state.root}: {describe_error(e, str(state.root))}; {stands}")


def _advance_last_pass(prep: Prepared, state: State, when: str, started_at: float) -> None:
    """After a passing xid check: move the last-pass marks (gpucheck.platform.kernlog.cursor) of what it
    examined, with the default window only: the node mark when every GPU was judged, else the
    marks of the selected GPUs (by UUID). Read, changed and written under the cursor's lock."""
    from .platform.kernlog.cursor import LAST_PASS_CURSOR, advance, covers_the_node, window_is_default
    from .xid.judge import DEFAULT_PARAMS

    ctx = prep.ctx
    if not window_is_default(ctx.params("xid", DEFAULT_PARAMS), ctx.options):
        return
    whole = covers_the_node(ctx.gpus, (ctx.snapshot.get("gpus") if ctx.snapshot else None) or [])
    uuids = [g["uuid"] for g in ctx.selected_gpu_entries() if isinstance(g.get("uuid"), str) and g["uuid"]]
    now = time.time()
    state.update_cursor(LAST_PASS_CURSOR, lambda cursor: advance(cursor, epoch=started_at, time=when, uuids=uuids,
                                                                 whole=whole, now=now))
