"""The runner: runs the selected checks under time budgets and never hangs.

Each check runs in a daemon thread that the runner supervises. A check that outlives its budget
is reported as a hang (`fail` of the check's subject, not a crash of gpucheck) and the run goes
on; a check that raises becomes an `error` result. Compute checks fan out to one worker process
per GPU themselves (gpucheck.workers), watching `ctx.cancel`.

SIGTERM, SIGINT (a Slurm prolog timeout, Ctrl-C) and the whole-run deadline set `ctx.cancel`, give
the running check a short grace period to stop its workers and return what it has, and mark every
check not run as `error` "not run: interrupted". The caller still gets an outcome and writes a
(partial) verdict.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from .check import Check, Context, Need, missing_need
from .result import Action, Result, Status, Threshold, worst_status

# How long a check may keep running after cancel before the runner gives up on it.
CANCEL_GRACE_S = 5.0
# Slack on top of a check's declared budget before it is called a hang.
BUDGET_SLACK_S = 5.0
BUDGET_FACTOR = 1.5


@dataclass
class CheckRun:
    check_id: str
    level: int
    status: Status
    duration_s: float
    results: list[Result] = field(default_factory=list)


@dataclass
class Outcome:
    runs: list[CheckRun]
    interrupted: str | None = None  # "SIGTERM", "SIGINT", "timeout" or None
    started_at: float = 0.0  # time.time()
    duration_s: float = 0.0

    @property
    def results(self) -> list[Result]:
        return [r for run in self.runs for r in run.results]

    @property
    def partial(self) -> bool:
        return self.interrupted is not None


class _Interrupted(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _error(check: Check, summary: str, evidence: list[str] | None = None) -> Result:
    return Result(check.id, Status.ERROR, summary, evidence=evidence or [])


def _unmet_needs(check: Check, ctx: Context) -> str | None:
    needs = list(check.spec.needs)
    # Judging a recorded snapshot: "not this node" is the whole reason, whatever this machine has.
    if Need.GPU in needs:
        needs.remove(Need.GPU)
        needs.insert(0, Need.GPU)
    reasons = []
    for n in needs:
        r = missing_need(n, ctx)
        if r and n is Need.GPU and ctx.options.get("snapshot_path"):
            return r
        if r:
            reasons.append(r)
    return "; ".join(reasons) if reasons else None


def _check_ctx(check: Check, ctx: Context) -> Context:
    # A check named explicitly above the run's level runs with its own level's parameters.
    if check.spec.level > ctx.level:
        return dataclasses.replace(ctx, level=check.spec.level)
    return ctx


def _finish(check: Check, results: object, t0: float) -> list[Result]:
    if not isinstance(results, list) or not all(isinstance(r, Result) for r in results):
        return [_error(check, f"check {check.id} returned {type(results).__name__}, not a list of results")]
    if not results:
        return [_error(check, f"check {check.id} returned no result")]
    dt = time.monotonic() - t0
    for r in results:
        if r.duration_s is None:
            r.duration_s = dt
    return results


def run_checks(
    checks: list[Check],
    ctx: Context,
    *,
    timeout_s: float | None = None,
    on_start: Callable[[Check], None] | None = None,
    on_done: Callable[[CheckRun], None] | None = None,
    install_signal_handlers: bool = True,
) -> Outcome:
    started = time.time()
    t_start = time.monotonic()
    if timeout_s is not None:
        ctx.deadline = t_start + timeout_s
    runs: list[CheckRun] = []
    interrupted: str | None = None

    old_handlers = {}
    if install_signal_handlers and threading.current_thread() is threading.main_thread():
        def handler(signum, _frame):
            name = signal.Signals(signum).name
            ctx.cancel.set()
            raise _Interrupted(name)

        for sig in (signal.SIGTERM, signal.SIGINT):
            old_handlers[sig] = signal.signal(sig, handler)

    try:
        for i, check in enumerate(checks):
            if interrupted is None and ctx.deadline is not None and time.monotonic() >= ctx.deadline:
                interrupted = "timeout"
                ctx.cancel.set()
            if interrupted is not None:
                runs.append(_not_run(check, interrupted))
                continue
            if on_start:
                on_start(check)
            try:
                run = _run_one(check, ctx)
            except _Interrupted as e:
                interrupted = e.reason
                run = _collect_after_cancel(check, ctx, e.reason)
            runs.append(run)
            if on_done:
                on_done(run)
            if run.results and any("whole-run timeout" in r.summary for r in run.results):
                interrupted = interrupted or "timeout"
    except _Interrupted as e:  # a signal between checks
        interrupted = e.reason
        done = {r.check_id for r in runs}
        runs.extend(_not_run(c, e.reason) for c in checks if c.id not in done)
    finally:
        for sig, old in old_handlers.items():
            signal.signal(sig, old)
    return Outcome(runs=runs, interrupted=interrupted, started_at=started, duration_s=time.monotonic() - t_start)


def _not_run(check: Check, reason: str) -> CheckRun:
    why = "whole-run timeout" if reason == "timeout" else f"interrupted by {reason}"
    return CheckRun(check.id, int(check.spec.level), Status.ERROR, 0.0,
                    [_error(check, f"not run: {why}")])


# The running check's completion event and result box, so that an interrupted run can wait for
# them (_collect_after_cancel).
_current: dict[str, object] = {}


def _run_one(check: Check, ctx: Context) -> CheckRun:
    t0 = time.monotonic()
    why = _unmet_needs(check, ctx)
    if why:
        return CheckRun(check.id, int(check.spec.level), Status.SKIP, 0.0,
                        [Result(check.id, Status.SKIP, why)])
    cctx = _check_ctx(check, ctx)
    box: dict[str, object] = {}
    # Completion is signalled with an Event, not Thread.join(): on CPython 3.11 a signal handler
    # that raises during join() can leave a running thread marked as stopped.
    done = threading.Event()

    def target():
        try:
            box["results"] = check.run(cctx)
        except BaseException as e:  # noqa: BLE001 - report anything a check throws
            box["exc"] = e
            box["tb"] = traceback.format_exc()
        finally:
            done.set()

    th = threading.Thread(target=target, name=f"check-{check.id}", daemon=True)
    _current.update(done=done, box=box, t0=t0)
    th.start()
    budget = check.spec.budget(cctx) * BUDGET_FACTOR + BUDGET_SLACK_S
    hard_stop = t0 + budget
    while not done.is_set():
        now = time.monotonic()
        if ctx.deadline is not None and now >= ctx.deadline:
            ctx.cancel.set()
            finished = done.wait(CANCEL_GRACE_S)
            results = _from_box(check, box, t0) if finished else []
            if not results or not finished:
                results = [_error(check, f"not finished: whole-run timeout after {now - t0:.1f} s in this check")]
            else:
                results = [*results]
                for r in results:
                    r.evidence.append("stopped early by the whole-run timeout")
            return _make_run(check, results, t0)
        if now >= hard_stop:
            r = Result(
                check.id,
                Status.FAIL,
                f"hang: check did not finish within its budget of {budget:.0f} s "
                "(a stuck driver call or GPU; gpucheck moved on)",
                action=Action.INVESTIGATE,
            )
            r.thresholds.append(Threshold("duration_s", ">", round(budget, 1), Status.FAIL, "s"))
            r.metric("duration_s", round(now - t0, 1), "s")
            return _make_run(check, [r], t0)
        done.wait(min(0.1, max(0.0, hard_stop - now)))
    return _make_run(check, _from_box(check, box, t0), t0)


def _from_box(check: Check, box: dict[str, object], t0: float) -> list[Result]:
    if "exc" in box:
        e = box["exc"]
        return [_error(check, f"internal error in check {check.id}: {type(e).__name__}: {e}",
                       str(box.get("tb", "")).strip().splitlines()[-12:])]
    return _finish(check, box.get("results"), t0)


def _collect_after_cancel(check: Check, ctx: Context, reason: str) -> CheckRun:
    """After a signal: give the running check a grace period to return partial results."""
    done = _current.get("done")
    box = _current.get("box", {})
    t0 = float(_current.get("t0", time.monotonic()))  # type: ignore[arg-type]
    ctx.cancel.set()
    finished = False
    if isinstance(done, threading.Event):
        deadline = time.monotonic() + CANCEL_GRACE_S
        while not finished and time.monotonic() < deadline:
            try:
                finished = done.wait(0.1)
            except _Interrupted:  # a second signal: stop waiting
                break
    results: list[Result] = []
    if finished and isinstance(box, dict) and box:
        results = _from_box(check, box, t0)
        for r in results:
            r.evidence.append(f"run interrupted by {reason}; results may be partial")
    if not results:
        results = [_error(check, f"not finished: interrupted by {reason}")]
    return _make_run(check, results, t0)


def _make_run(check: Check, results: list[Result], t0: float) -> CheckRun:
    return CheckRun(check.id, int(check.spec.level), worst_status(r.status for r in results),
                    time.monotonic() - t0, results)
