"""`gpucheck judge CAPTURE...`: judge whatever an operator pastes, offline (docs/judge.md).

Each file's kind is detected (gpucheck.platform.captures: the capture table), each is read into a
fragment of a snapshot document, the fragments of one node are assembled (mixed kinds add up; a
time series of one kind becomes a sequence of documents), and the level-1 checks judge the
documents through the same pipeline as `gpucheck run --snapshot` (gpucheck.app): the same grid,
JSON and exit codes (0 healthy, 1 a fault, 3 could not judge). The earlier documents of a series
are judged first, quietly, into a history kept in a temporary state directory only for this
command, so that the delta and flap rules compare each reading with the one before; the verdict
printed is the latest document's. A file of no known kind, an empty one or one that cannot be
read is exit 2, named, before anything is judged.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .app import EXIT_USAGE, RunRequest, execute
from .platform.messages import say_error
from .platform.captures import Capture, CaptureReadError, Step, assemble, detect_kind, kinds, plan_steps
from .platform.telemetry.source import CaptureTelemetry, ReplayTelemetry, is_capture


@dataclass
class JudgeRequest:
    """What `gpucheck judge` was asked: the capture files and the verdict's outputs."""

    paths: list[str]
    json: bool = False
    verbose: bool = False
    output: str | None = None
    strict: bool | None = None
    on_error: str | None = None
    config_path: str | None = None
    check_patterns: list[str] = field(default_factory=list)
    skip_patterns: list[str] = field(default_factory=list)


class JudgeInputError(ValueError):
    """A capture that cannot be judged: no known kind, empty, unreadable (one line, naming it)."""


class CapturesTelemetry(CaptureTelemetry):
    """An assembled document judged as assembled (its GPU part converted from a capture, or none)."""

    description = "the captures"


def read_captures(paths: list[str]) -> list[Capture]:
    """Every file's kind and fragment, in argument order. Raises JudgeInputError naming the
    first file that is of no known kind, empty or unreadable."""
    out: list[Capture] = []
    for order, text in enumerate(paths):
        path = Path(text)
        if not path.exists():
            raise JudgeInputError(f"{text}: no such file")
        try:
            kind = detect_kind(path)
            if kind is None:
                names = ", ".join(k.name for k in kinds())
                raise JudgeInputError(f"{text}: not a capture of a known kind (known: {names})")
            out.append(Capture(path=path, kind=kind, fragment=kind.read(path), order=order))
        except CaptureReadError as e:
            raise JudgeInputError(str(e)) from None
    return out


def telemetry_of(step: Step) -> CaptureTelemetry | ReplayTelemetry:
    """A recorded gpucheck snapshot replays through the live reader (as `run --snapshot`); a
    converted capture, or a document with no GPU telemetry, is judged as assembled."""
    doc: Mapping[str, Any] = step.document
    gpu = step.gpu_capture
    if gpu is not None and gpu.kind.name == "gpucheck snapshot" and not is_capture(doc):
        return ReplayTelemetry(doc)
    return CapturesTelemetry(doc)


def _patterns(req: JudgeRequest, steps: list[Step]) -> list[str]:
    """The checks: the level-1 ones (none named), and eud.dcgm where a DCGM diag capture is
    among the captures (it judges the recorded document instead of running DCGM). Named, the
    level-1 compute checks are left out: a check named is one the run must examine, and a
    capture cannot be computed on."""
    if req.check_patterns:
        return list(req.check_patterns)
    if any("dcgm_diag" in s.document for s in steps):
        from .tests_suite.registry import all_checks

        return [c.id for c in all_checks(max_level=1) if not c.spec.is_compute] + ["eud.dcgm"]
    return []


def _request(req: JudgeRequest, step: Step, state_dir: str, patterns: list[str], last: bool) -> RunRequest:
    return RunRequest(
        level=1, check_patterns=patterns, skip_patterns=list(req.skip_patterns), json=req.json or not last,
        output=req.output if last else None, strict=req.strict, on_error=req.on_error,
        config_path=req.config_path, snapshot_path=step.label, state_dir=state_dir,
        telemetry=telemetry_of(step), verbose=req.verbose, history=True)


def judge(req: JudgeRequest) -> int:
    """Judge the captures; print the verdict of the latest document; its exit code (2: a file
    that cannot be judged, named on stderr)."""
    try:
        captures = read_captures(req.paths)
    except JudgeInputError as e:
        say_error(str(e))
        return EXIT_USAGE
    plan, notes = plan_steps(captures)
    steps = [assemble(s) for s in plan]
    patterns = _patterns(req, steps)
    for message in notes + [w for s in steps for w in s.warnings] + _capture_warnings(steps):
        print(f"gpucheck: WARNING: {message}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="gpucheck-judge-") as state_dir:
        for step in steps[:-1]:  # the earlier readings of a series: into the history only
            with contextlib.redirect_stdout(io.StringIO()):
                execute(_request(req, step, state_dir, patterns, last=False))
        return execute(_request(req, steps[-1], state_dir, patterns, last=True))


def _capture_warnings(steps: list[Step]) -> list[str]:
    """What a converted nvidia-smi capture says was missing (as `run --snapshot` prints it)."""
    out = []
    for step in steps:
        gpu = step.gpu_capture
        capture = step.document.get("capture") if gpu is not None else None
        if isinstance(capture, dict):
            out += [f"{gpu.path}: {w}" for w in capture.get("warnings") or [] if gpu is not None]
    return out
