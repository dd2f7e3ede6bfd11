"""The run pipeline shared by `gpucheck run` and the per-check commands (`burn`, ...).

config -> selection -> telemetry (live NVML or a snapshot file) -> runner -> verdict -> outputs
(stdout table or JSON, --output, --prom, history, last-pass cursor) -> exit code.

Usage problems (bad level, unknown check, --gpus naming a missing GPU, a file that is not a
snapshot, an unwritable output) raise UsageError before any check runs: exit 2, one line.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .check import Check, Context, Level, Need
from .config import Config, ConfigError, load_config
from .inject import Injection, InjectionError, parse_injection
from .registry import SelectionError, all_checks, select
from .state import State, atomic_write_text, default_state_dir
from .verdict import EXIT_USAGE, build_verdict

LIVE_TELEMETRY_TIMEOUT_S = 30.0
LAST_PASS_CURSOR = "last-pass"


class UsageError(Exception):
    """A problem with what the user asked for: exit 2 with this one-line message."""


@dataclass
class RunRequest:
    level: Level | int | str | None = None
    check_patterns: list[str] = field(default_factory=list)
    skip_patterns: list[str] = field(default_factory=list)
    gpus: list[int] | None = None
    device: str = "auto"
    workers: int = 2
    injections: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
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
    force: bool = False  # load GPUs that are in use (gpucheck.busy)


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


MAX_GPU_INDEX = 1023  # NVML numbers GPUs from 0; no node has a thousand of them


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
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{what} {path}: is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{what} {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {path}: folder {parent} is not writable")


def _collect_live(timeout_s: float) -> dict[str, Any]:
    """Read NVML in a daemon thread so that a hung driver cannot hang the gate."""
    from .telemetry.snapshot import collect_snapshot, unreadable_snapshot

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["snap"] = collect_snapshot()
        except Exception as e:  # the reader maps NVML errors itself; anything else is reported
            box["err"] = f"{type(e).__name__}: {e}"

    th = threading.Thread(target=target, name="telemetry", daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        return unreadable_snapshot("other", f"NVML did not answer within {timeout_s:.0f} s (driver hang?)")
    if "err" in box:
        return unreadable_snapshot("other", f"reading telemetry failed: {box['err']}")
    return box["snap"]


def prepare(req: RunRequest) -> Prepared:
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

    strict = bool(config.run.get("strict", False)) if req.strict is None else req.strict
    on_error = req.on_error or config.run.get("on_error", "pass")
    if on_error not in ("pass", "fail"):
        raise UsageError(f"--on-error: must be pass or fail, not {on_error!r}")
    timeout_s = req.timeout_s if req.timeout_s is not None else config.run.get("timeout")
    if timeout_s is not None and timeout_s <= 0:
        raise UsageError("--timeout must be positive")
    if req.device not in ("auto", "cuda", "cpu"):
        raise UsageError(f"--device: must be auto, cuda or cpu, not {req.device!r}")
    if req.workers < 1:
        raise UsageError("--workers must be at least 1")

    try:
        checks = select(catalog, level, req.check_patterns, skips)
    except SelectionError as e:
        raise UsageError(str(e)) from None
    if not checks:
        raise UsageError("no check selected (everything was skipped)")

    try:
        injections = [parse_injection(t) for t in req.injections]
    except InjectionError as e:
        raise UsageError(f"--inject: {e}") from None
    for inj in injections:
        if not any(inj.kind in c.spec.injects for c in checks):
            honoured = sorted({k for c in catalog for k in c.spec.injects}) or ["none"]
            raise UsageError(
                f"--inject {inj.text}: no selected check honours {inj.kind!r} "
                f"(kinds: {', '.join(honoured)})"
            )

    for path, what in ((req.output, "--output"), (req.prom, "--prom")):
        if path and path != "-":
            _check_writable(path, what)

    snapshot: dict[str, Any] | None = None
    source_kind = "none"
    if req.snapshot_path:
        from .telemetry.snapshot import SnapshotError, load_snapshot

        try:
            snapshot = load_snapshot(req.snapshot_path)
        except SnapshotError as e:
            raise UsageError(str(e)) from None
        source_kind = "snapshot"
    elif req.device != "cpu" or any(Need.NVML in c.spec.needs for c in checks):
        snapshot = _collect_live(LIVE_TELEMETRY_TIMEOUT_S)
        source_kind = "live"

    gpus = req.gpus
    if gpus is not None:
        if req.device == "cpu":
            known = list(range(req.workers))
            unit = "CPU worker"
        else:
            known = sorted(int(g["index"]) for g in (snapshot or {}).get("gpus", []))
            unit = "GPU"
        missing = [g for g in gpus if g not in known]
        if missing:
            have = ",".join(map(str, known)) if known else "none"
            raise UsageError(
                f"--gpus: no {unit} {','.join(map(str, missing))} on this node ({unit}s: {have})"
            )

    state: State | None = None
    explicit_state = req.state_dir or config.run.get("state_dir")
    if req.history and (explicit_state or not req.snapshot_path):
        # A replayed snapshot is another node's past: keep it out of this node's history unless
        # a state directory was named on purpose.
        state = State(explicit_state or default_state_dir())

    options = dict(req.options)
    if req.snapshot_path:
        options["snapshot_path"] = req.snapshot_path
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
        force=req.force,
    )
    return Prepared(config, level, checks, ctx, strict, on_error, timeout_s, source_kind,
                    req.snapshot_path, injections)


def execute(
    req: RunRequest,
    *,
    progress: Callable[[str, str, dict[str, Any]], None] | None = None,
    display_factory: Callable[[], Any] | None = None,
    on_verdict: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """Run the pipeline; print the table (or JSON); write outputs; return the exit code.

    `on_verdict(verdict)` receives the verdict as soon as it is built, before any output is
    written (the Slurm hooks judge from it, so that no output step can mask it).

    On a terminal (and not --json) a live display shows progress: `display_factory()` builds it
    (an object with started(check), progress(check_id, subject, info), finished(run), close()),
    by default a one-line status (gpucheck.output.LiveStatus).
    """
    from .runner import run_checks

    try:
        prep = prepare(req)
    except UsageError as e:
        print(f"gpucheck: error: {e}", file=sys.stderr)
        return EXIT_USAGE

    display = None
    if not req.json and sys.stdout.isatty():
        if display_factory is None:
            from .output import LiveStatus as display_factory
        display = display_factory()
        prep.ctx.progress = progress or display.progress
    elif progress is not None:
        prep.ctx.progress = progress

    try:
        outcome = run_checks(
            prep.checks,
            prep.ctx,
            timeout_s=prep.timeout_s,
            on_start=display.started if display else None,
            on_done=display.finished if display else None,
        )
    finally:
        if display:
            display.close()

    from .fingerprint import software_fingerprint

    verdict = build_verdict(
        outcome.results,
        level=prep.level,
        started_at=outcome.started_at,
        duration_s=outcome.duration_s,
        checks=[{"id": r.check_id, "level": r.level, "status": r.status.value,
                 "duration_s": round(r.duration_s, 3)} for r in outcome.runs],
        software=software_fingerprint(prep.ctx.snapshot),
        snapshot=prep.ctx.snapshot,
        source_kind=prep.source_kind,
        source_path=prep.snapshot_path,
        interrupted=outcome.interrupted,
        injected=[i.text for i in prep.injections],
        strict=prep.strict,
        on_error=prep.on_error,
    )
    code = int(verdict["exit_code"])
    if on_verdict is not None:
        on_verdict(verdict)

    text = json.dumps(verdict, indent=2, sort_keys=False) + "\n"
    if req.json:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        from .output import print_verdict

        print_verdict(verdict)

    rc_override: int | None = None
    if req.output:
        if req.output == "-":
            if not req.json:
                sys.stdout.write(text)
        else:
            try:
                atomic_write_text(req.output, text)
            except OSError as e:
                print(f"gpucheck: error: --output {req.output}: {e.strerror or e}", file=sys.stderr)
                rc_override = EXIT_USAGE
    if req.prom:
        from .prom import write_prom

        try:
            write_prom(req.prom, verdict)
        except OSError as e:
            print(f"gpucheck: error: --prom {req.prom}: {e.strerror or e}", file=sys.stderr)
            rc_override = EXIT_USAGE

    if prep.ctx.state is not None:
        _record(prep, verdict, outcome.started_at)
    return rc_override if rc_override is not None else code


def _record(prep: Prepared, verdict: dict[str, Any], started_at: float) -> None:
    state = prep.ctx.state
    assert state is not None
    try:
        state.append_history(verdict)
        xid_ok = any(c["id"] == "xid" and c["status"] in ("pass", "warn") for c in verdict["checks"])
        if verdict["exit_code"] == 0 and not verdict["partial"] and xid_ok and prep.source_kind != "snapshot":
            state.write_cursor(LAST_PASS_CURSOR, {"time": verdict["time"], "epoch": started_at})
    except OSError as e:
        print(f"gpucheck: warning: cannot write history in {state.root}: {e.strerror or e}", file=sys.stderr)
