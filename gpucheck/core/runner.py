"""The runner: runs the selected checks under time budgets and never hangs.

Order: every read-only check (NVML judges, the kernel log) runs before any compute check, so a
compute check can never starve them of the run's time. The outcome lists the checks in the order
they were selected.

Each check is one CheckExecution: a daemon thread the runner supervises, with a context of its
own whose `cancel` event stops that check alone, and a typed `interruption` (a signal, the run's
time limit, a hang; None when it returned by itself). A check that outlives its budget is
reported as a hang (`fail` of the check's subject, not a crash of gpucheck), is cancelled and
given HANG_GRACE_S to return, and the run goes on; one that does not return is left behind
(`left_running`, Outcome.abandoned: the caller kills its worker processes). A check that raises
becomes an `error` result. Compute checks fan out to one worker process per GPU themselves
(gpucheck.workers), watching `ctx.cancel`. Why a run stopped is the runner's own record
(Interruption, Outcome.interrupted), never read back from a result's text.

Time limit (`timeout_s`, counted from `started`): the run ends inside it. `limits()` splits it:
checks work until `ctx.deadline`; then the running check is cancelled and has `ctx.stop_s` to stop
its workers and return (the stop reserve, a tenth of the limit, 0.5 to 5 s); OUTPUT_RESERVE_S is
left to write the verdict. A check still running at the end of its stop time is abandoned with an
error. A compute check whose `min_slice` does not fit in what is left before the deadline is not
started: `error`, "not run", naming what it needed and what was left.

SIGTERM, SIGINT (a Slurm prolog timeout, Ctrl-C) are recorded by gpucheck.platform.interrupts (never
raised): the runner cancels the running check, gives it `ctx.stop_s` to return what it has (a
second signal stops the wait), and marks every check not run as `error` "not run: interrupted".
The caller still gets an outcome and writes a (partial) verdict.

Skips: a compute check that cannot load this node's GPUs (no GPU, no CUDA torch, no CuPy) is an
`unexamined` skip when the run was asked to examine them (check.must_examine); and when the user
named the checks and none of them examined anything, every skip among them is unexamined (a check
that does not apply to this node's shape, one GPU where it needs two, is not counted).
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from ..platform.interrupts import Interrupts
from .check import Check, Context, compute_skip, does_not_apply, unmet_needs
from .result import Action, Result, Status, Threshold, worst_status

# How long a cancelled check may take to stop when the run has no time limit (signals).
CANCEL_GRACE_S = 5.0
# With a time limit: this share of it is reserved to stop the running check, within these bounds.
STOP_RESERVE_FRACTION = 0.1
STOP_RESERVE_MIN_S = 0.5
# With a time limit: reserved at its end to build and write the verdict.
OUTPUT_RESERVE_S = 0.3
# Slack on top of a check's declared budget before it is called a hang.
BUDGET_SLACK_S = 5.0
BUDGET_FACTOR = 1.5
# A check past its budget is cancelled and has this long to return before the run moves on without it.
HANG_GRACE_S = 1.0
POLL_S = 0.05


class InterruptionKind(enum.Enum):
    SIGNAL = "signal"  # SIGTERM/SIGINT: the check and the run are cancelled
    TIMEOUT = "timeout"  # the run's time limit: the check and the run are cancelled
    HANG = "hang"  # the check outlived its own budget: it alone is cancelled, the run goes on


@dataclass(frozen=True)
class Interruption:
    """Why a check was stopped before it returned on its own."""

    kind: InterruptionKind
    reason: str  # the signal's name (SIGTERM, SIGINT), "timeout" or "hang"

    @property
    def stops_the_run(self) -> str | None:
        """The run's `interrupted` value this stop means (None: the run goes on)."""
        return None if self.kind is InterruptionKind.HANG else self.reason


@dataclass
class CheckRun:
    check_id: str
    level: int  # the check's own level
    status: Status
    duration_s: float
    results: list[Result] = field(default_factory=list)
    ran: bool = False  # it examined something (not a skip, not "not run")
    run_level: int = 0  # the level it ran at (CheckSpec.run_level)
    applies: bool = True  # False: skipped as not applying to this node's shape (one GPU, no peers)
    interruption: Interruption | None = None  # why it was stopped; None: it returned on its own (or never ran)
    left_running: bool = False  # it did not stop when cancelled: its thread (and workers) may live on


@dataclass
class Outcome:
    runs: list[CheckRun]
    interrupted: str | None = None  # "SIGTERM", "SIGINT", "timeout" or None
    started_at: float = 0.0  # time.time()
    duration_s: float = 0.0
    abandoned: bool = False  # a check did not stop in time; its thread (and workers) may live on

    @property
    def results(self) -> list[Result]:
        return [r for run in self.runs for r in run.results]

    @property
    def partial(self) -> bool:
        return self.interrupted is not None


@dataclass(frozen=True)
class Limits:
    """A run's time limit, split: work until `deadline`, stop by `stop_by`, end by `end`."""

    deadline: float
    stop_by: float
    end: float
    stop_s: float


def limits(started: float, timeout_s: float) -> Limits:
    """The split of a `timeout_s` limit that began at `started` (time.monotonic()). A very short
    limit gives at most half of itself to the stop reserve."""
    end = started + timeout_s
    stop_by = end - min(OUTPUT_RESERVE_S, 0.15 * timeout_s)
    stop_s = min(CANCEL_GRACE_S, max(STOP_RESERVE_MIN_S, STOP_RESERVE_FRACTION * timeout_s),
                 0.5 * (stop_by - started))
    return Limits(deadline=stop_by - stop_s, stop_by=stop_by, end=end, stop_s=stop_s)


def _error(check: Check, summary: str, evidence: list[str] | None = None) -> Result:
    return Result(check.id, Status.ERROR, summary, evidence=evidence or [])


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


def execution_order(checks: list[Check]) -> list[Check]:
    """Read-only checks first, then compute checks, each group in the selection's order."""
    return sorted(checks, key=lambda c: c.spec.is_compute)


def run_checks(
    checks: list[Check],
    ctx: Context,
    *,
    timeout_s: float | None = None,
    started: float | None = None,
    interrupts: Interrupts | None = None,
    on_start: Callable[[Check], None] | None = None,
    on_done: Callable[[CheckRun], None] | None = None,
    install_signal_handlers: bool = True,
) -> Outcome:
    """Run `checks`; `started` (time.monotonic()) is when the run began (default now): the time
    limit counts from it. `interrupts`: the caller's armed recorder; without one the runner arms
    its own for the duration of the call (install_signal_handlers, main thread only)."""
    t0 = time.monotonic() if started is None else started
    wall0 = time.time() - (time.monotonic() - t0)
    lim = limits(t0, timeout_s) if timeout_s is not None else None
    if lim is not None:
        ctx.deadline, ctx.stop_s = lim.deadline, lim.stop_s
    own = interrupts is None
    if interrupts is None:
        interrupts = Interrupts()
        if install_signal_handlers:
            interrupts.arm()
    interrupts.listen(ctx.cancel)
    try:
        by_id, interrupted, abandoned = _run_all(checks, ctx, lim, interrupts, on_start, on_done)
    finally:
        if own:
            interrupts.disarm()
    runs = [by_id[c.id] for c in checks]
    _asked_but_unexamined(runs, ctx)
    return Outcome(runs=runs, interrupted=interrupted, started_at=wall0, duration_s=time.monotonic() - t0,
                   abandoned=abandoned)


def _run_all(checks: list[Check], ctx: Context, lim: Limits | None, interrupts: Interrupts,
             on_start: Callable[[Check], None] | None, on_done: Callable[[CheckRun], None] | None
             ) -> tuple[dict[str, CheckRun], str | None, bool]:
    runs: dict[str, CheckRun] = {}
    stopped: str | None = None  # the run stopped: every check after is not run
    cut = False  # a compute check was not started for lack of time
    abandoned = False
    for check in execution_order(checks):
        if stopped is None:
            stopped = interrupts.reason or (
                "timeout" if ctx.deadline is not None and time.monotonic() >= ctx.deadline else None)
        if stopped is not None:
            runs[check.id] = _not_run(check, stopped)
            continue
        short = _no_slice(check, ctx)
        if short is not None:
            cut = True
            runs[check.id] = short
            continue
        if on_start:
            on_start(check)
        run = _execute(check, ctx, lim, interrupts)
        stopped = run.interruption.stops_the_run if run.interruption is not None else None
        abandoned = abandoned or run.left_running
        runs[check.id] = run
        if on_done:
            on_done(run)
    return runs, stopped or ("timeout" if cut else None), abandoned


def _asked_but_unexamined(runs: list[CheckRun], ctx: Context) -> None:
    """A run of named checks (--check, `gpucheck burn`, ...) none of which examined anything did
    not do what it was asked: every skip among them is unexamined (the run exits 3)."""
    asked = [run for run in runs if run.check_id in ctx.requested and run.applies]
    if not asked or any(run.ran for run in asked):
        return
    for run in asked:
        for r in run.results:
            if r.status is Status.SKIP:
                r.unexamined = True


def _not_run(check: Check, reason: str) -> CheckRun:
    why = "whole-run timeout" if reason == "timeout" else f"interrupted by {reason}"
    return CheckRun(check.id, int(check.spec.level), Status.ERROR, 0.0, [_error(check, f"not run: {why}")])


def _no_slice(check: Check, ctx: Context) -> CheckRun | None:
    """A compute check that cannot get a meaningful slice of what is left of the run's time:
    its `error` run, or None when it fits (or has no time limit, or will be skipped anyway)."""
    if ctx.deadline is None or not check.spec.is_compute or unmet_needs(check, ctx)[0]:
        return None
    need = check.spec.min_slice(_check_ctx(check, ctx))
    left = ctx.deadline - time.monotonic()
    if left >= need.seconds:
        return None
    r = _error(check, f"not run: the run's time limit leaves {max(0.0, left):.1f} s for it and {check.id} "
                      f"needs at least {need.seconds:.1f} s ({need.what})")
    r.metric("time_left_s", round(max(0.0, left), 2), "s")
    r.metric("time_needed_s", round(need.seconds, 2), "s")
    r.thresholds.append(Threshold("time_left_s", "<", round(need.seconds, 2), Status.ERROR, "s", Action.NONE))
    return CheckRun(check.id, int(check.spec.level), Status.ERROR, 0.0, [r])


def _execute(check: Check, ctx: Context, lim: Limits | None, interrupts: Interrupts) -> CheckRun:
    """The check's run: a skip when its needs are not met here, else its supervised execution."""
    why, compute = unmet_needs(check, ctx)
    if why:
        return _skipped(check, ctx, why, compute)
    execution = CheckExecution(check, ctx, interrupts)
    execution.start()
    return execution.supervise(lim, interrupts)


def _skipped(check: Check, ctx: Context, why: str, compute: bool) -> CheckRun:
    """A check whose needs are not met here: its skip, unexamined where the run was asked to examine it."""
    skip = compute_skip(ctx, check.id, why) if check.spec.is_compute and compute else Result(check.id, Status.SKIP, why)
    return CheckRun(check.id, int(check.spec.level), Status.SKIP, 0.0, [skip], applies=not does_not_apply(check, ctx))


class CheckExecution:
    """One check running in a thread of its own, supervised by the runner.

    The check gets its own context, whose `cancel` event is set when this check must stop (a
    signal, the run's time limit, its own budget outlived) and only then: a hung check is
    cancelled without cancelling the checks after it. What the check returned or raised, and
    why it was stopped (`interruption`, None when it returned on its own), are fields of this
    object; `left_running` says that its thread did not stop when asked (it is a daemon thread:
    it cannot hold the interpreter's exit, and the caller kills its worker processes).
    """

    def __init__(self, check: Check, ctx: Context, interrupts: Interrupts):
        self.check = check
        self.run_ctx = ctx
        self.cancel = threading.Event()
        interrupts.listen(self.cancel)  # a signal reaches the check at once, as it reaches the run
        self.ctx = dataclasses.replace(_check_ctx(check, ctx), cancel=self.cancel)
        self.budget_s = check.spec.budget(self.ctx) * BUDGET_FACTOR + BUDGET_SLACK_S
        self.done = threading.Event()  # set when check.run returned or raised
        self.returned: object = None
        self.raised: BaseException | None = None
        self.traceback = ""
        self.interruption: Interruption | None = None
        self.t0 = 0.0
        self._thread: threading.Thread | None = None

    @property
    def left_running(self) -> bool:
        return self._thread is not None and not self.done.is_set()

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._target, name=f"check-{self.check.id}", daemon=True)
        self._thread.start()

    def _target(self) -> None:
        try:
            self.returned = self.check.run(self.ctx)
        except BaseException as e:  # noqa: BLE001 - report anything a check throws
            self.raised = e
            self.traceback = traceback.format_exc()
        finally:
            self.done.set()

    def supervise(self, lim: Limits | None, interrupts: Interrupts) -> CheckRun:
        """Wait for the check, polling the signal record, the run's deadline and the check's
        budget between short waits (never Thread.join()); stop it when one of them comes first."""
        hard_stop = self.t0 + self.budget_s
        while True:
            finished = self.done.wait(POLL_S)
            now = time.monotonic()
            # A signal cancels the check at once: one that finished after a signal may have
            # stopped early, and says so.
            if interrupts.reason is not None:
                return self._stop(Interruption(InterruptionKind.SIGNAL, interrupts.reason), lim, interrupts)
            if not finished and self.run_ctx.deadline is not None and now >= self.run_ctx.deadline:
                return self._stop(Interruption(InterruptionKind.TIMEOUT, "timeout"), lim, interrupts)
            if finished:
                return self._make_run(self._results())
            if now >= hard_stop:
                return self._hang(lim, interrupts)

    def _wait_stopped(self, seconds: float, lim: Limits | None, interrupts: Interrupts) -> bool:
        """After cancel: wait up to `seconds` (never past the run's stop point; a second signal
        ends the wait) for the check to return. Whether it did."""
        signals = interrupts.count
        until = time.monotonic() + seconds
        if lim is not None:
            until = min(until, lim.stop_by)
        while not self.done.is_set() and time.monotonic() < until and interrupts.count <= max(signals, 1):
            self.done.wait(min(POLL_S, max(0.0, until - time.monotonic())))
        return self.done.is_set()

    def _stop(self, why: Interruption, lim: Limits | None, interrupts: Interrupts) -> CheckRun:
        """A signal or the run's time limit: cancel the check (and the run) and give it
        ctx.stop_s to return what it has."""
        self.interruption = why
        self.run_ctx.cancel.set()
        self.cancel.set()
        finished = self._wait_stopped(self.run_ctx.stop_s, lim, interrupts)
        results = self._results() if finished else []
        if results:
            note = ("stopped early by the whole-run timeout" if why.kind is InterruptionKind.TIMEOUT
                    else f"run interrupted by {why.reason}; results may be partial")
            for r in results:
                r.evidence.append(note)
        else:
            what = "the whole-run timeout" if why.kind is InterruptionKind.TIMEOUT else why.reason
            results = [_error(self.check, f"not finished: stopped by {what} after "
                                          f"{time.monotonic() - self.t0:.1f} s in this check"
                                          + ("" if finished else f"; it did not stop within {self.run_ctx.stop_s:.1f} s"))]
        return self._make_run(results)

    def _hang(self, lim: Limits | None, interrupts: Interrupts) -> CheckRun:
        """The check outlived its budget: a hang (`fail`), and it is cancelled, alone, with
        HANG_GRACE_S to return, so that nothing of it runs on beside the next checks where it
        can stop; one that does not stop is left running (and its workers killed at the end)."""
        elapsed = time.monotonic() - self.t0
        self.interruption = Interruption(InterruptionKind.HANG, "hang")
        self.cancel.set()
        stopped = self._wait_stopped(HANG_GRACE_S, lim, interrupts)
        r = Result(self.check.id, Status.FAIL,
                   f"hang: check did not finish within its budget of {self.budget_s:.0f} s "
                   "(a stuck driver call or GPU; gpucheck moved on)", action=Action.INVESTIGATE)
        r.thresholds.append(Threshold("duration_s", ">", round(self.budget_s, 1), Status.FAIL, "s"))
        r.metric("duration_s", round(elapsed, 1), "s")
        r.evidence.append("cancelled at its budget: it stopped" if stopped else
                          f"cancelled at its budget: still running {HANG_GRACE_S:g} s later (left behind; its "
                          "worker processes are killed when the run ends)")
        return self._make_run([r])

    def _results(self) -> list[Result]:
        if self.raised is not None:
            e = self.raised
            return [_error(self.check, f"internal error in check {self.check.id}: {type(e).__name__}: {e}",
                           self.traceback.strip().splitlines()[-12:])]
        return _finish(self.check, self.returned, self.t0)

    def _make_run(self, results: list[Result]) -> CheckRun:
        run = _make_run(self.check, self.run_ctx, results, self.t0)
        run.interruption = self.interruption
        run.left_running = self.left_running
        return run


def _make_run(check: Check, ctx: Context, results: list[Result], t0: float) -> CheckRun:
    return CheckRun(check.id, int(check.spec.level), worst_status(r.status for r in results),
                    time.monotonic() - t0, results, ran=any(r.status is not Status.SKIP for r in results),
                    run_level=check.spec.run_level(int(ctx.level)))
