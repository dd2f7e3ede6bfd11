"""The run pipeline shared by `gpucheck run` and the per-check commands (`burn`, ...).

config -> selection -> telemetry (live NVML or a snapshot file) -> runner -> verdict -> outputs
(stdout table or JSON, --output, --prom, history, last-pass cursor) -> exit code.

Usage problems (bad level, unknown check, --gpus naming a missing GPU, a file that is not a
snapshot, an output path that cannot be written, an unsafe state directory) raise UsageError
before any check runs: exit 2, one line. Once the checks have run, outputs never mask the
verdict: a write that fails then is a loud warning and the verdict's exit code stands.
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
from .state import State, default_state_dir
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


def parse_gpu_list(text: str | None) -> list[int] | None:
    """'0,3' / '0-3,6' / 'all' -> indices; UsageError on anything else."""
    if text is None or text.strip() in ("", "all"):
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            if dash:
                a, b = int(lo), int(hi)
                if a > b:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise UsageError(f"--gpus: bad GPU list {text!r} (want e.g. 0,3 or 0-3)") from None
    if any(i < 0 for i in out):
        raise UsageError(f"--gpus: bad GPU list {text!r}")
    return sorted(set(out))


def _check_writable(path: str, what: str) -> None:
    """UsageError when `path` cannot be an output (gpucheck.safeio: a regular file or a new name
    in an existing writable folder, a FIFO, /dev/null, a terminal; a symlink only when trusted)."""
    from .safeio import check_output

    try:
        check_output(path)
    except OSError as e:
        raise UsageError(f"{what} {path}: {_output_problem(e, path)}") from None


def _output_problem(e: OSError, path: str) -> str:
    from .safeio import output_problem

    return output_problem(e, path)


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
        try:
            state.check()
        except OSError as e:
            from .safeio import describe_error

            raise UsageError(f"state directory {state.root}: {describe_error(e, str(state.root))}") from None

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
    )
    return Prepared(config, level, checks, ctx, strict, on_error, timeout_s, source_kind,
                    req.snapshot_path, injections)


def execute(
    req: RunRequest,
    *,
    progress: Callable[[str, str, dict[str, Any]], None] | None = None,
    display_factory: Callable[[], Any] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> int:
    """Run the pipeline; print the table (or JSON); write outputs; return the exit code.

    On a terminal (and not --json) a live display shows progress: `display_factory()` builds it
    (an object with started(check), progress(check_id, subject, info), finished(run), close()),
    by default a one-line status (gpucheck.output.LiveStatus).

    Outputs never mask the verdict: a failed --output/--prom/history/cursor write is a warning on
    stderr (and passed to `on_warning`, e.g. a hook's syslog) and the verdict's exit code stands.
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

    text = json.dumps(verdict, indent=2, sort_keys=False) + "\n"
    if req.json:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        from .output import print_verdict

        print_verdict(verdict)

    def warn(message: str) -> None:
        _warn(message, on_warning)

    _write_outputs(req, verdict, text, warn)
    if prep.ctx.state is not None:
        _record(prep, verdict, outcome.started_at, warn)
    return code


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


def _write_outputs(req: RunRequest, verdict: dict[str, Any], text: str, warn: Callable[[str], None]) -> None:
    """--output and --prom ("-" is stdout). A write that fails is a warning; the verdict stands."""
    from .prom import render
    from .safeio import write_output

    stands = f"the verdict stands ({verdict['status']}, exit {verdict['exit_code']})"
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


def _record(prep: Prepared, verdict: dict[str, Any], started_at: float, warn: Callable[[str], None]) -> None:
    from .safeio import describe_error

    state = prep.ctx.state
    assert state is not None
    if state.skipped_lines:
        warn(f"history in {state.root}: {state.skipped_lines} torn or unreadable line(s) skipped "
             f"({'; '.join(state.skipped_notes[:3])})")
    try:
        state.append_history(verdict)
        xid_ok = any(c["id"] == "xid" and c["status"] in ("pass", "warn") for c in verdict["checks"])
        if verdict["exit_code"] == 0 and not verdict["partial"] and xid_ok and prep.source_kind != "snapshot":
            state.write_cursor(LAST_PASS_CURSOR, {"time": verdict["time"], "epoch": started_at})
    except OSError as e:
        warn(f"cannot write the history in {state.root}: {describe_error(e, str(state.root))}; "
             f"the verdict stands ({verdict['status']}, exit {verdict['exit_code']})")
