"""`gpucheck repro record`: what may be written to the reference file, and the exit code. A node
operation beside the run pipeline (gpucheck.app), which it uses to prepare the run: it drives the
repro.bitwise check's own collection, so it sits above the checks, next to the fleet operations.

On a known-good node the repro.bitwise workloads run twice on every selected GPU (the check's
own collection, gpucheck.tests_suite.repro_bitwise.collect) and their digests are added to the
reference file under the node's fingerprint, atomically (gpucheck.repro.store). Nothing is
written, and the outcome says why, when:

- a GPU is non-deterministic, hung or crashed, or the node's GPUs of one fingerprint disagree
  (repro.judge.plan_record): refused, exit 1;
- a digest disagrees with one already recorded for the same fingerprint: refused, exit 1;
- --inject was given (an injected digest is never a reference): refused, exit 1;
- the workloads could not run or be judged (no GPU, no CUDA in torch, a workload not run twice,
  interrupted): exit 3;
- the file cannot be written: exit 2.

A usage problem found before anything runs (a bad --gpus, --out, --workload, config) is a
RecordUsageError naming the option (exit 2). Messages go to `say(kind, text)` as they happen:
"info" (stdout, the text view), "refusal" (stderr, the text view), "warning" and "error"
(stderr, always); the caller renders them and the JSON summary.

Imports nothing heavy: the workers import torch, never this module.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .platform.messages import error_line

if TYPE_CHECKING:  # pragma: no cover
    from .tests_suite.repro_bitwise import ReproParams

CHECK_ID = "repro.bitwise"

Say = Callable[[str, str], None]


class RecordUsageError(Exception):
    """What was asked cannot be done (exit 2); `option` names the option at fault, or None."""

    def __init__(self, option: str | None, message: str):
        super().__init__(message)
        self.option = option


@dataclass
class RecordRequest:
    out: str | None = None  # the reference file; None: the check's `reference` parameter
    level: str = "2"
    workloads: list[str] | None = None
    device: str = "auto"
    workers: int = 2
    gpus: list[int] | None = None
    config_path: str | None = None
    injections: list[str] = field(default_factory=list)
    dry_run: bool = False
    force: bool = False


@dataclass
class RecordOutcome:
    exit_code: int  # 0 recorded (or already recorded, or a dry run), 1 refused, 2 not written, 3 could not run
    summary: dict[str, Any] | None = None  # the JSON summary (None: nothing was judged)


def record_references(req: RecordRequest, say: Say) -> RecordOutcome:
    """Run the workloads, judge whether they may be recorded, record them (unless a dry run)."""
    from .repro.judge import plan_record
    from .repro.workloads import WorkloadError
    from .core.result import Status
    from .sdk.workers import returned_data
    from .tests_suite.repro_bitwise import collect

    check, ctx, p, path = _prepare(req)
    if not _can_run(check, ctx, say, path):
        return RecordOutcome(3)
    try:
        col = collect(ctx, p)
    except WorkloadError as e:
        raise RecordUsageError("--workload", str(e)) from None
    records, problems, by_key = plan_record(CHECK_ID, col.outcomes)
    problems = [(Status.ERROR if r.status == Status.SKIP else r.status, f"{r.subject}: {r.summary}")
                for r in col.results] + problems
    if not col.outcomes and not problems:
        problems.append((Status.ERROR, "no GPU selected to record"))
    if req.injections and not problems:
        problems.append((Status.FAIL, "--inject was given: injected digests are never recorded"))
    fps = {key: returned_data(col.outcomes[gs[0]])["fingerprint"] for key, gs in by_key.items()}  # (usable runs)
    summary = _summary(path, col, by_key, fps, [t for _, t in problems])
    _say_fingerprints(say, col.device, by_key, fps)
    if problems:
        say("refusal", "refusing to record (nothing written):")
        for _, text in problems:
            say("refusal", f"  {text}")
        return RecordOutcome(1 if any(s == Status.FAIL for s, _ in problems) else 3, summary)
    for _, digests in records:
        for w, d in digests.items():
            say("info", f"  {w:18s} {d}")
    if req.dry_run:
        say("info", f"dry run: nothing written to {path}")
        return RecordOutcome(0, summary)
    return _write(path, records, col.not_run, summary, say)


def _prepare(req: RecordRequest) -> "tuple[Any, Any, ReproParams, str]":
    """The check, the run's context, the check's parameters and the reference file's path;
    RecordUsageError for what cannot be done."""
    from .app import RunRequest, UsageError, prepare
    from .repro import store
    from .tests_suite.repro_bitwise import DEFAULTS, ReproOptions, reference_path

    run = RunRequest(level=req.level, check_patterns=[CHECK_ID], gpus=req.gpus, device=req.device,
                     workers=req.workers, injections=list(req.injections),
                     check_options=(ReproOptions(workloads=req.workloads),) if req.workloads else (),
                     config_path=req.config_path, history=False, force=req.force)
    try:
        prep = prepare(run)
    except UsageError as e:
        raise RecordUsageError(None, str(e)) from None
    ctx, check = prep.ctx, prep.checks[0]
    p = ctx.params(check.id, DEFAULTS)  # the check's defaults (check.spec.defaults) merged with the config
    path = req.out or reference_path(ctx, p)[0]
    try:
        store.check_writable(path)
        store.load(path, missing_ok=True)
    except store.RefFileError as e:
        raise RecordUsageError("--out", str(e)) from None
    return check, ctx, p, path


def _can_run(check: Any, ctx: Any, say: Say, path: str) -> bool:
    """Whether the check's needs are met here (else an error message); warns about a reference
    file that others could change."""
    from .core.check import missing_need
    from .repro import store

    for need in check.spec.needs:
        why = missing_need(need, ctx)
        if why:
            say("error", f"gpucheck repro record: cannot record: {why}")
            return False
    for problem in store.permission_problems(path):
        say("warning", f"gpucheck repro record: warning: {problem}")
    return True


def _summary(path: str, col: Any, by_key: dict[str, list[int]], fps: dict[str, Any],
             problems: list[str]) -> dict[str, Any]:
    return {
        "path": path, "written": False, "device": col.device, "workloads": col.workloads,
        "not_run": col.not_run,
        "fingerprints": [{"key": k, "fingerprint": fps[k], "gpus": gs} for k, gs in by_key.items()],
        "problems": problems, "conflicts": [], "added": {}, "unchanged": {},
    }


def _say_fingerprints(say: Say, device: str, by_key: dict[str, list[int]], fps: dict[str, Any]) -> None:
    from .repro.fingerprint import describe, short_key

    unit = "CPU worker" if device == "cpu" else "GPU"
    for key, gs in by_key.items():
        say("info", f"fingerprint {short_key(key)} ({len(gs)} {unit}(s) {', '.join(map(str, gs))}): {describe(fps[key])}")


def _write(path: str, records: list[Any], not_run: dict[str, str], summary: dict[str, Any],
           say: Say) -> RecordOutcome:
    """Add the records to the reference file: refused on a conflict with what it holds (exit 1),
    exit 2 when it cannot be written."""
    from .repro import store
    from .platform.safeio import describe_error

    try:
        res = store.record(path, records, host=socket.gethostname())
    except store.RecordConflict as e:
        summary["conflicts"] = [c.describe() for c in e.conflicts]
        say("refusal", f"refusing to record: digests disagree with the reference already in {path} "
                       "(file unchanged):")
        for c in e.conflicts:
            say("refusal", f"  {c.describe()}")
        return RecordOutcome(1, summary)
    except store.RefFileError as e:
        raise RecordUsageError("--out", str(e)) from None
    except OSError as e:
        say("error", error_line(f"{path}: {describe_error(e, path)}", "gpucheck repro record"))
        return RecordOutcome(2)
    summary.update(written=res.written, added=res.added, unchanged=res.unchanged)
    if res.written:
        n = sum(len(v) for v in res.added.values())
        kept = sum(len(v) for v in res.unchanged.values())
        say("info", f"recorded {n} digest(s) in {path}" + (f" ({kept} already recorded)" if res.unchanged else ""))
    else:
        say("info", f"already recorded in {path}: nothing to add")
    for w, why in not_run.items():
        say("info", f"  {w} not run on this device: {why}")
    return RecordOutcome(0, summary)
