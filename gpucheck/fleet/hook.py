"""The Slurm hooks: `gpucheck slurm prolog` and `gpucheck slurm epilog`.

A prolog or epilog that exits non-zero makes Slurm drain the node ("Prolog error", a reason
`resume` never undoes); a failed prolog also fails an interactive job (srun) and requeues a
batch job (held). A drain reason set before the hook exits is kept, so on an unhealthy verdict
the hook drains the node itself with
`scontrol update NodeName=<node> State=DRAIN Reason="gpucheck: <cause>"` and exits
EXIT_HOOK_UNHEALTHY (42), which the wrapper (scripts/slurm/gpucheck-hook.sh) turns into exit 1.
Only that code means "judged unhealthy": any other non-zero exit is gpucheck's own failure,
which the wrapper logs and passes through on-error.

Could not judge (an error result, a run cut short by the budget, a usage error in the hook's
settings, a config problem, a bug in gpucheck): the node is not drained and the hook exits 0,
unless the site chose fail-closed (on-error fail: `--on-error`, else GPUCHECK_ON_ERROR, else
the config's `[run] on_error`, read on its own so that it survives other errors in the file),
in which case it drains with "gpucheck: could not judge: ..." and exits 42. Either way one line
goes to syslog (LOG_DAEMON, ident "gpucheck"), and the history in the state directory gets the
verdict, or, when there is none, a could-not-judge verdict naming the cause. The verdict is
captured in memory as soon as it is built: no write (history, cursors, syslog, stdout) can
change the judgement. SIGTERM and SIGINT are held (recorded, never fatal) from before the run
until the hook has decided, drained and logged (`signals_held`): a node judged unhealthy and
being drained when Slurm's timeout comes still gets exit 42. The jobs cursor (each job's start
and ECC reading, for its epilog) is read, changed and written under its lock
(State.update_cursor): two prologs at once both keep their job.

The hook's options come from the parsed command line (hook_options), or, when it cannot be
parsed, are read loosely from the raw arguments (options_from_args), so that a usage error
is still logged, recorded and put through on-error. scontrol runs through an injectable
runner, syslog through an injectable logger (gpucheck.fleet.slurm).
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import syslog
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, TypedDict

from ..core.levels import Level
from ..core.reason import hook_reason
from ..core.result import Status
from ..core.verdict import Verdict, unjudged_verdict
from ..platform.argv import option_value
from ..platform.messages import error_text
from .slurm import JobEnv, Logger, Runner, default_runner, drain, find_scontrol, job_env, syslog_logger

JOBS_CURSOR = "slurm-jobs"
JOBS_KEPT = 64
# `gpucheck slurm prolog|epilog` exits with this code, and only with it, when the node was
# judged unhealthy (drained, or to be failed): a code that neither Python (1: a traceback,
# 2: its own usage error, 120: output it could not flush), nor the shell (126, 127), nor a
# signal (128+N) produces by itself, so that the wrapper (scripts/slurm/gpucheck-hook.sh) can
# tell a verdict from gpucheck's own failure. It turns it into exit 1 for Slurm.
EXIT_HOOK_UNHEALTHY = 42
ON_ERROR_ENV = "GPUCHECK_ON_ERROR"
# Set by the wrapper from Slurm's PrologEpilogTimeout: the epoch by which gpucheck must have ended
# (it sends SIGTERM then, SIGKILL a little later, before Slurm's own SIGKILL), and the timeout.
DEADLINE_ENV = "GPUCHECK_HOOK_DEADLINE"
TIMEOUT_ENV = "GPUCHECK_PROLOG_EPILOG_TIMEOUT"
MIN_RUN_S = 1.0  # a budget shorter than this judges nothing


@dataclass
class HookOptions:
    kind: str  # prolog | epilog
    level: str | None = None
    checks: list[str] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)
    budget_s: float | None = None
    failed_level: str | None = None  # epilog: level after a failed job
    failed_budget_s: float | None = None
    failed_checks: list[str] = field(default_factory=list)
    on_error: str | None = None  # pass | fail; None: GPUCHECK_ON_ERROR, the config's run.on_error, pass
    strict: bool | None = None
    snapshot: str | None = None  # may hold {node}
    state_dir: str | None = None  # may hold {node}
    config_path: str | None = None
    device: str = "auto"
    workers: int = 2
    drain: bool = True
    scontrol: str | None = None
    as_json: bool = False
    all_gpus: bool = False  # ignore the job's GPU list
    force: bool = False  # load GPUs that processes are using (gpucheck.workers.busy)


@dataclass(frozen=True)
class HookDefaults:
    """What a hook runs when its options do not say."""

    level: str | None  # None: the config's level, else the run's default
    checks: tuple[str, ...]  # (): the level's checks
    budget_s: float
    failed_level: str | None = None  # the epilog after a failed job
    failed_budget_s: float | None = None


PROLOG_DEFAULTS = HookDefaults(level="1", checks=(), budget_s=15.0)
EPILOG_DEFAULTS = HookDefaults(level=None, checks=("xid", "ecc", "memory-remap"), budget_s=60.0, failed_level="2",
                               failed_budget_s=600.0)


class HookPlan(TypedDict, total=False):
    """What a hook decided and what went wrong on the way, none of it changing the judgement
    (HookOutcome.plan)."""

    node: str
    job: str | None
    on_error: str  # pass | fail
    on_error_from: str  # --on-error, GPUCHECK_ON_ERROR, config, default
    state_dir: str
    job_start: float | None  # the epilog: when the job started
    job_start_from: str  # prolog record, scontrol StartTime, unknown
    job_failed: bool | None
    level: str | None
    checks: list[str]
    budget_s: float | None
    budget_note: str  # the budget was shrunk to end before Slurm's PrologEpilogTimeout
    slurm_timeout: str  # Slurm's PrologEpilogTimeout and where it was read (or why it is unknown)
    gpus: list[int] | None  # None: every GPU
    gpus_from: str | None
    gpus_note: str | None
    warnings: list[str]  # the pipeline's warnings after the verdict (a write that failed)
    output_error: str  # an output that failed after the verdict
    cursor_error: str  # the jobs cursor could not be read or written
    traceback: str  # gpucheck's own bug
    signal: str  # SIGTERM/SIGINT that came while the hook ran


@dataclass(frozen=True)
class HookClock:
    """When the hook must have ended: before Slurm's PrologEpilogTimeout, which Slurm enforces with
    SIGKILL and a drain ("Prolog error") that no --on-error can undo."""

    deadline: float | None  # epoch; None: no timeout is known
    timeout_s: float | None  # Slurm's PrologEpilogTimeout
    source: str  # where they came from, or why they are unknown


def wrapper_margin_s(timeout_s: float) -> float:
    """What the wrapper keeps between its SIGTERM to gpucheck and Slurm's SIGKILL: a tenth of the
    timeout, 2 to 30 s, and a second of slack (scripts/slurm/gpucheck-hook.sh does the same)."""
    return min(30.0, max(2.0, float(int(timeout_s) // 10))) + 1.0


def hook_clock(environ: Mapping[str, str], started: float, scontrol: str, runner: Runner) -> HookClock:
    """The wrapper's GPUCHECK_HOOK_DEADLINE; without the wrapper (gpucheck itself as Prolog=),
    Slurm's PrologEpilogTimeout from `scontrol show config`, less the wrapper's margin, from the
    hook's start. A hook that slurmd did not start (SLURM_SCRIPT_CONTEXT, which slurmd sets for
    its Prolog and Epilog, is not there: run by hand) has no Slurm timeout."""
    from .slurm import prolog_epilog_timeout

    if TIMEOUT_ENV in environ:  # the wrapper asked Slurm (or the site told it): never ask again
        deadline, timeout = environ.get(DEADLINE_ENV, ""), environ.get(TIMEOUT_ENV, "")
        if re.fullmatch(r"[0-9]{1,12}", deadline) and re.fullmatch(r"[0-9]{1,5}", timeout):
            return HookClock(float(deadline), float(timeout), f"PrologEpilogTimeout = {timeout} (the wrapper)")
        return HookClock(None, None, f"none (the wrapper: {TIMEOUT_ENV}={timeout!r})")
    if environ.get("SLURM_SCRIPT_CONTEXT") not in ("prolog_slurmd", "epilog_slurmd"):
        return HookClock(None, None, "none (not started by slurmd: no SLURM_SCRIPT_CONTEXT)")
    if runner is default_runner:  # slurmctld not answering must not eat the hook's time
        runner = functools.partial(default_runner, timeout_s=5.0)
    timeout_s, source = prolog_epilog_timeout(scontrol, runner)
    if timeout_s is None:
        return HookClock(None, None, source)
    return HookClock(started + timeout_s - wrapper_margin_s(timeout_s), timeout_s, source)


def fit_budget(budget_s: float | None, clock: HookClock, now: float) -> tuple[float | None, str]:
    """The budget the run may use so that the hook ends before `clock.deadline`, keeping a fifth of
    what is left (1 to 10 s) for the history, the cursors, a drain and the log; and what was
    changed ("" when the budget fits). A budget of None is none. None: no time to judge anything."""
    if clock.deadline is None:
        return budget_s, ""
    left = clock.deadline - now
    fit = left - min(10.0, max(1.0, 0.2 * left))
    slurm = (f"Slurm's PrologEpilogTimeout is {clock.timeout_s:g} s, and past it Slurm kills the hook with "
             "SIGKILL and drains the node")
    if fit < MIN_RUN_S:
        return None, f"no time to judge: {left:.1f} s left before the hook must end ({slurm})"
    if budget_s is not None and budget_s <= fit:
        return budget_s, ""
    was = f"budget {budget_s:g} s" if budget_s is not None else "no budget"
    return fit, f"{was} shrunk to {fit:.1f} s ({slurm})"


def split_ids(values: Iterable[str]) -> list[str]:
    """Check ids given repeated, comma lists, or both: ["xid,ecc", "pcie"] -> ["xid", "ecc", "pcie"]."""
    return [c for s in values for c in s.split(",") if c.strip()]


def hook_options(kind: str, values: Mapping[str, Any]) -> HookOptions:
    """The hook's options from its parsed command line: `values` by option name (the durations
    `budget_s`, `failed_budget_s` already in seconds; the check lists may hold comma lists)."""
    return HookOptions(
        kind=kind, level=values["level"], checks=split_ids(values["checks"]), skips=split_ids(values["skips"]),
        budget_s=values["budget_s"], failed_level=values.get("failed_level"),
        failed_budget_s=values.get("failed_budget_s"), failed_checks=split_ids(values.get("failed_checks", ())),
        on_error=values["on_error"], strict=values["strict"], snapshot=values["snapshot"],
        state_dir=values["state_dir"], config_path=values["config_path"], device=values["device"],
        workers=values["workers"], drain=not values["no_drain"], scontrol=values["scontrol"],
        as_json=values["as_json"], all_gpus=values["all_gpus"], force=values["force"],
    )


def options_from_args(kind: str, args: list[str]) -> HookOptions:
    """What can be read from the raw arguments of a hook whose command line could not be parsed:
    enough to log, record and apply on-error (--on-error, --state-dir, --config, --scontrol,
    --no-drain); a value that is not valid is passed over."""
    on_error = option_value(args, "--on-error")
    return HookOptions(kind=kind, on_error=on_error if on_error in ("pass", "fail") else None,
                       state_dir=option_value(args, "--state-dir"), config_path=option_value(args, "--config"),
                       scontrol=option_value(args, "--scontrol"), drain="--no-drain" not in args)


@dataclass
class HookOutcome:
    exit_code: int  # 0 or EXIT_HOOK_UNHEALTHY
    judgement: str  # healthy | unhealthy | could-not-judge
    cause: str
    verdict: Verdict | None = None
    drained: bool = False
    reason: str | None = None
    log_line: str = ""
    plan: HookPlan = field(default_factory=lambda: HookPlan())
    ecc_changes: list[str] = field(default_factory=list)


def _expand(template: str | None, node: str) -> str | None:
    return template.replace("{node}", node) if template else template


def ecc_by_uuid(verdict: Verdict | None) -> dict[str, dict[str, float]]:
    """{gpu uuid (else gpuN): {counter: value}}: the error counters (unit "count") of a verdict's
    ecc results."""
    if verdict is None:
        return {}
    uuids = {g.index: g.uuid for g in verdict.gpus}
    out: dict[str, dict[str, float]] = {}
    for r in verdict.results:
        if r.check != "ecc" or r.gpu is None:
            continue
        key = uuids.get(r.gpu) or f"gpu{r.gpu}"
        vals = {name: float(m.value) for name, m in r.metrics.items()
                if m.unit == "count" and isinstance(m.value, (int, float)) and not isinstance(m.value, bool)}
        if vals:
            out[key] = vals
    return out


def ecc_changes(before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]],
                labels: Mapping[str, str] | None = None) -> list[str]:
    """Counters that grew between two ECC readings: ["gpu3 volatile_uncorrected +2", ...]."""
    labels = labels or {}
    out = []
    for key, now in after.items():
        prev = before.get(key)
        if not prev:
            continue
        for name in sorted(now, key=lambda m: ("uncorrected" not in m, m)):  # uncorrectable first
            if name in prev and now[name] > prev[name]:
                out.append(f"{labels.get(key, key)} {name} +{now[name] - prev[name]:g}")
    return out


def _gpu_labels(verdict: Verdict | None) -> dict[str, str]:
    return {g.uuid: f"gpu{g.index}" for g in (verdict.gpus if verdict is not None else ()) if g.uuid}


class _StderrTail:
    """sys.stderr while the pipeline runs: every write goes on to the real stream (a failing
    write there, /dev/full or a full disk, is dropped: it must not change the judgement) and the
    last lines are kept, so that a usage error's one line can be named in the log."""

    def __init__(self, stream: Any, keep: int = 4000):
        self._stream = stream
        self._keep = keep
        self.text = ""

    def write(self, text: str) -> int:
        self.text = (self.text + text)[-self._keep:]
        try:
            self._stream.write(text)
        except (OSError, ValueError):
            pass
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def error_line(self) -> str:
        """The message of the last `gpucheck <command>: error: ...` line ("" if none)."""
        for line in reversed(self.text.splitlines()):
            message = error_text(line)
            if message is not None:
                return message
        return ""


def _warning_sink(plan: HookPlan, log: Logger) -> Callable[[str], None]:
    """A sink for the pipeline's warnings (an output, history or cursor write that failed after
    the verdict): each goes to the log (syslog) and into the plan; none changes the judgement."""

    def sink(message: str) -> None:
        plan.setdefault("warnings", []).append(message)
        try:
            log(syslog.LOG_WARNING, f"warning: {' '.join(message.split())}")
        except Exception:  # the log is best effort
            pass

    return sink


def _run_gpucheck(req, execute, plan: HookPlan, log: Logger | None = None) -> tuple[int, Verdict | None, str]:
    """Run the pipeline and capture the verdict in memory, the moment it is built: no output
    (history, the table on stdout) written after it can change it. Returns the exit code the
    verdict says (else the pipeline's), the verdict, and the pipeline's error line."""
    captured: list[Verdict] = []
    tail = _StderrTail(sys.stderr)
    try:
        with contextlib.redirect_stderr(tail):
            code = execute(req, on_verdict=captured.append,
                           on_warning=_warning_sink(plan, log) if log is not None else None)
    except Exception as e:
        if not captured:
            raise
        code = None
        plan["output_error"] = f"{type(e).__name__}: {e} (after the verdict; the verdict stands)"
    if captured:
        verdict = captured[-1]
        return verdict.exit_code, verdict, tail.error_line()
    return int(code), None, tail.error_line()


def _job_start(env: JobEnv, state, scontrol: str, runner: Runner) -> tuple[float | None, dict[str, Any] | None, str]:
    """When the job started (the prolog's record, else scontrol's StartTime) and the prolog's ECC
    reading; the third value says where the start came from, or why it is unknown (then the epilog
    judges the default window, which is wider)."""
    if env.job_id and state is not None:
        jobs = state.read_cursor(JOBS_CURSOR) or {}
        rec = jobs.get(env.job_id) if isinstance(jobs, dict) else None
        if isinstance(rec, dict) and isinstance(rec.get("start"), (int, float)):
            return float(rec["start"]), rec.get("ecc") or {}, "prolog record"
    if env.job_id:
        from ..platform.kernlog.timeparse import parse_timestamp
        from ..platform.slurmjob import ShowJobError, parse_show_job

        rc, out, err = runner([scontrol, "-o", "show", "job", env.job_id])
        if rc != 0:
            return None, None, f"unknown (scontrol show job exit {rc}: {' '.join((err or out).split())[:160]})"
        try:  # a job's name or paths cannot move StartTime (gpucheck.platform.slurmjob)
            start = parse_timestamp(parse_show_job(out, env.job_id).start_time)
        except ShowJobError as e:
            return None, None, f"unknown ({e})"
        if start is not None:
            return start, None, "scontrol StartTime"
    return None, None, "unknown"


def _remember_job(state, env: JobEnv, start: float, verdict: Verdict | None) -> None:
    """Add the job to the jobs cursor (its start and the GPUs' ECC counters), keeping the newest
    JOBS_KEPT: read, changed and written under the cursor's lock (State.update_cursor), so that
    two prologs at once both keep their job."""
    if not env.job_id or state is None:
        return
    record = {"start": start, "ecc": ecc_by_uuid(verdict)}

    def add(jobs: Any) -> dict[str, Any]:
        jobs = jobs if isinstance(jobs, dict) else {}
        jobs[env.job_id] = record
        if len(jobs) > JOBS_KEPT:
            for old in sorted(jobs, key=lambda k: _job_start_of(jobs[k]))[:-JOBS_KEPT]:
                del jobs[old]
        return jobs

    state.update_cursor(JOBS_CURSOR, add)


def _job_start_of(record: Any) -> float:
    start = record.get("start", 0) if isinstance(record, dict) else 0
    return float(start) if isinstance(start, (int, float)) and not isinstance(start, bool) else 0.0


def _forget_job(state, env: JobEnv) -> None:
    """Remove the job from the jobs cursor (under its lock; nothing written when it is not there)."""
    if not env.job_id or state is None:
        return

    def remove(jobs: Any) -> dict[str, Any] | None:
        if isinstance(jobs, dict) and env.job_id in jobs:
            del jobs[env.job_id]
            return jobs
        return None

    state.update_cursor(JOBS_CURSOR, remove)


@dataclass
class _Hook:
    """One run of a hook: what it was asked, the job, where it logs, drains and records."""

    opts: HookOptions
    env: JobEnv
    runner: Runner
    log: Logger
    now: Callable[[], float]
    started: float
    scontrol: str
    on_error: str
    state: Any  # gpucheck.core.state.State
    plan: HookPlan
    environ: Mapping[str, str] = field(default_factory=dict)
    clock: HookClock | None = None  # read when the run is planned (hook_clock)

    @property
    def what(self) -> str:
        return f"slurm {self.opts.kind}"

    def say(self, priority: int, line: str) -> None:
        """One line to syslog (a cause or a node name with a newline forges no other line); a
        logger that fails must not change the judgement."""
        try:
            self.log(priority, " ".join(line.split()))
        except Exception:
            pass


@dataclass
class _Judged:
    judgement: str  # healthy | unhealthy | could-not-judge
    cause: str
    verdict: Verdict | None = None
    changes: list[str] = field(default_factory=list)


def resolve_on_error(explicit: str | None, environ: Mapping[str, str], config_path: str | None) -> tuple[str, str]:
    """What a hook does when it cannot judge, and which setting said so: --on-error, else
    GPUCHECK_ON_ERROR (the wrapper's env file), else the config's `[run] on_error` (read on its
    own, so that it survives any other error in the file), else pass. A value other than pass
    or fail is passed over."""
    from ..core.config import read_on_error

    if explicit in ("pass", "fail"):
        return explicit, "--on-error"
    if environ.get(ON_ERROR_ENV) in ("pass", "fail"):
        return environ[ON_ERROR_ENV], ON_ERROR_ENV
    configured = read_on_error(config_path)
    if configured:
        return configured, "config"
    return "pass", "default"


def _setup(opts: HookOptions, environ: Mapping[str, str], runner: Runner, log: Logger,
           now: Callable[[], float]) -> _Hook:
    from ..core.state import State, default_state_dir

    started = now()
    env = job_env(environ)
    on_error, on_error_from = resolve_on_error(opts.on_error, environ, opts.config_path)
    state_root = _expand(opts.state_dir, env.node) or str(default_state_dir())
    plan = HookPlan(node=env.node, job=env.job_id, on_error=on_error, on_error_from=on_error_from,
                    state_dir=state_root)
    return _Hook(opts=opts, env=env, runner=runner, log=log, now=now, started=started,
                 scontrol=find_scontrol(opts.scontrol), on_error=on_error, state=State(state_root), plan=plan,
                 environ=environ)


def _plan_request(hook: _Hook):
    """The pipeline request for this hook and job (and, in the epilog, the prolog's ECC reading)."""
    from ..app import RunRequest

    opts, env, plan = hook.opts, hook.env, hook.plan
    defaults = PROLOG_DEFAULTS if opts.kind == "prolog" else EPILOG_DEFAULTS
    level = opts.level or defaults.level
    checks = list(opts.checks) or list(defaults.checks)
    budget: float | None = opts.budget_s if opts.budget_s is not None else defaults.budget_s
    options: dict[str, Any] = {}
    prior_ecc: dict[str, Any] | None = None
    if opts.kind == "epilog":
        start, prior_ecc, start_from = _job_start(env, hook.state, hook.scontrol, hook.runner)
        if start is not None:
            options["xid_since"] = f"@{start:.3f}"
        plan.update(HookPlan(job_start=start, job_start_from=start_from, job_failed=env.failed))
        if env.failed:
            level = opts.failed_level or defaults.failed_level
            checks = list(opts.failed_checks)
            budget = opts.failed_budget_s if opts.failed_budget_s is not None else defaults.failed_budget_s
    budget = _fit_to_slurm(hook, budget)
    gpus = None if opts.all_gpus else env.gpus
    plan.update(HookPlan(level=level, checks=checks, budget_s=budget, gpus=gpus, gpus_from=env.gpus_from,
                         gpus_note=env.gpus_note))
    # The job's GPUs were given by Slurm: one that NVML does not list is judged (inventory: missing,
    # fail), not a usage error.
    req = RunRequest(level=level, check_patterns=checks, skip_patterns=list(opts.skips), gpus=gpus,
                     gpus_assigned=gpus is not None, device=opts.device, workers=opts.workers, options=options,
                     json=opts.as_json, strict=opts.strict, on_error="pass", config_path=opts.config_path,
                     snapshot_path=_expand(opts.snapshot, env.node), state_dir=str(hook.state.root),
                     timeout_s=budget, history=True, force=opts.force)
    return req, prior_ecc


class _NoTime(Exception):
    """Slurm's PrologEpilogTimeout leaves the hook no time to judge anything."""


def _fit_to_slurm(hook: _Hook, budget: float | None) -> float | None:
    """The budget, shrunk (and said so) to end before Slurm's PrologEpilogTimeout; _NoTime when
    nothing can be judged in the time left."""
    hook.clock = hook_clock(hook.environ, hook.started, hook.scontrol, hook.runner)
    hook.plan["slurm_timeout"] = hook.clock.source
    fitted, note = fit_budget(budget, hook.clock, hook.now())
    if note:
        hook.plan["budget_note"] = note
        hook.say(syslog.LOG_WARNING, f"{hook.what} {hook.env.label()}: warning: {note}")
    if fitted is None:
        raise _NoTime(note)
    return fitted


def _bookkeeping(hook: _Hook, verdict: Verdict | None, prior_ecc: dict[str, Any] | None) -> list[str]:
    """The prolog remembers the job for the epilog; the epilog names ECC growth and forgets the
    job. A failed write here (full disk, read-only state) is noted and never changes the judgement."""
    changes: list[str] = []
    try:
        if hook.opts.kind == "prolog":
            _remember_job(hook.state, hook.env, hook.started, verdict)
        else:
            changes = ecc_changes(prior_ecc or {}, ecc_by_uuid(verdict), _gpu_labels(verdict))
            _forget_job(hook.state, hook.env)
    except Exception as e:
        hook.plan["cursor_error"] = f"{type(e).__name__}: {e}"
    return changes


def _usage_problem(hook: _Hook, error_line: str) -> str:
    """Why the pipeline refused to run (exit 2): its error line, else what is wrong with the config."""
    from ..core.config import ConfigError, load_config

    if error_line:
        return error_line
    try:
        load_config(hook.opts.config_path)
    except ConfigError as e:
        return str(e)
    return "see stderr"


def _judge_node(hook: _Hook, execute) -> _Judged:
    from .sweep import verdict_cause

    try:
        req, prior_ecc = _plan_request(hook)
    except _NoTime as e:
        return _Judged("could-not-judge", str(e))
    code, verdict, error_line = _run_gpucheck(req, execute, hook.plan, hook.log)
    changes = _bookkeeping(hook, verdict, prior_ecc)
    if code == 0:
        warned = verdict_cause(verdict) if verdict is not None and verdict.status is Status.WARN else ""
        return _Judged("healthy", warned, verdict, changes)
    if code == 1:
        return _Judged("unhealthy", verdict_cause(verdict) if verdict else "unhealthy", verdict, changes)
    if verdict is not None:
        return _Judged("could-not-judge", verdict_cause(verdict), verdict, changes)
    if code == 2:
        return _Judged("could-not-judge", f"usage or configuration error: {_usage_problem(hook, error_line)}")
    return _Judged("could-not-judge", error_line or f"gpucheck exited {code} without a verdict")


def run_hook(
    opts: HookOptions,
    environ: Mapping[str, str],
    *,
    runner: Runner = default_runner,
    log: Logger = syslog_logger,
    execute: Callable[..., int] | None = None,
    now: Callable[[], float] = time.time,
) -> HookOutcome:
    """Run the prolog or epilog for the job described by `environ`; drain on unhealthy.

    Exit code EXIT_HOOK_UNHEALTHY when the node was judged unhealthy (or could not be judged and
    on-error is fail), else 0. gpucheck's own failures never raise out of here."""
    if execute is None:
        from ..app import execute
    with signals_held() as interrupts:
        hook = _setup(opts, environ, runner, log, now)
        try:
            judged = _judge_node(hook, execute)
        except Exception as e:  # gpucheck's own bug: never let it take the node down by itself
            judged = _Judged("could-not-judge", f"internal error: {type(e).__name__}: {e}")
            hook.plan["traceback"] = traceback.format_exc(limit=5)
        return _conclude(hook, judged, interrupts)


@contextlib.contextmanager
def signals_held():
    """SIGTERM and SIGINT recorded, never fatal (gpucheck.platform.interrupts.INTERRUPTS), from before the
    hook runs until it has decided, drained and logged: a signal before the verdict makes the
    verdict partial (the pipeline's rule), one after it changes nothing, and the hook still exits
    with its judgement (a node being drained is not left drained with an exit that says "run the
    job"). Armed here when the caller has not (in-process use; restored on return); the console
    script arms them at its first line and ignores them after its last output
    (gpucheck.cli.start)."""
    from ..platform.interrupts import INTERRUPTS

    armed_here = INTERRUPTS.arm()
    try:
        yield INTERRUPTS
    finally:
        if armed_here:
            INTERRUPTS.disarm()


def hook_failed(
    opts: HookOptions,
    environ: Mapping[str, str],
    cause: str,
    *,
    runner: Runner = default_runner,
    log: Logger = syslog_logger,
    now: Callable[[], float] = time.time,
) -> HookOutcome:
    """A hook that could not run at all (a usage error in its settings, a crash before the
    pipeline): like any could-not-judge outcome, logged, recorded in the history, then on-error."""
    with signals_held() as interrupts:
        hook = _setup(opts, environ, runner, log, now)
        return _conclude(hook, _Judged("could-not-judge", cause), interrupts)


def _record_unjudged(hook: _Hook, cause: str) -> str:
    """Append a could-not-judge verdict (core.verdict.unjudged_verdict: one `error` result, check
    `slurm.<hook>`) to the history for a run that produced none; "" or why it could not be written."""
    from ..platform.fingerprint import software_fingerprint

    try:
        try:
            level = Level.parse(hook.plan.get("level") or 1)
        except ValueError:
            level = Level.QUICK
        verdict = unjudged_verdict(f"slurm.{hook.opts.kind}", cause, level=level, started_at=hook.started,
                                   duration_s=max(0.0, hook.now() - hook.started), host=hook.env.node,
                                   software=software_fingerprint(None))
        hook.state.append_history(verdict.to_json())
    except Exception as e:
        return f"history not written: {type(e).__name__}: {e}"
    return ""


def _drain_node(hook: _Hook, cause: str) -> tuple[bool, str]:
    """Drain the node: (True, the reason set), or (False, why not: --no-drain, scontrol not
    found, the scontrol error), which the hook's log line says."""
    if not hook.opts.drain:
        return False, "--no-drain"
    try:
        drained, reason = drain(hook.env.node, cause, scontrol=hook.scontrol, runner=_drain_runner(hook))
    except Exception as e:
        drained, reason = False, f"{type(e).__name__}: {e}"
    if not drained:
        hook.say(syslog.LOG_ERR, f"{hook.what} {hook.env.label()}: cannot drain: {reason}")
    return drained, reason


def _drain_runner(hook: _Hook) -> Runner:
    """scontrol for the drain, within what is left before Slurm's PrologEpilogTimeout (the
    wrapper's SIGKILL comes a margin after its deadline; an injected runner is used as it is)."""
    clock = hook.clock
    if hook.runner is not default_runner or clock is None or clock.deadline is None or clock.timeout_s is None:
        return hook.runner
    limit = clock.deadline + wrapper_margin_s(clock.timeout_s) - 2.0 - hook.now()
    return functools.partial(default_runner, timeout_s=min(30.0, max(1.0, limit)))


def hook_exit_code(judgement: str, on_error: str) -> int:
    """The hook's exit code, decided here only: EXIT_HOOK_UNHEALTHY for a node judged unhealthy,
    or not judged with on-error fail (drained or not: --no-drain, no scontrol); else 0."""
    if judgement == "unhealthy" or (judgement == "could-not-judge" and on_error == "fail"):
        return EXIT_HOOK_UNHEALTHY
    return 0


def _conclude(hook: _Hook, judged: _Judged, interrupts: Any = None) -> HookOutcome:
    """Apply on-error, drain, record what the history lacks, log one line: the hook's outcome.
    A signal meanwhile (recorded by `interrupts`) is noted in the plan and changes nothing."""
    judgement, cause, changes = judged.judgement, judged.cause, judged.changes
    if judgement == "unhealthy" and changes:  # the most specific news first: the reason is cut at REASON_MAX
        cause = f"during job {hook.env.job_id}: {', '.join(changes)}; {cause}"
    closed = judgement == "could-not-judge" and hook.on_error == "fail"
    drained, reason, not_drained = False, None, ""
    if judgement == "unhealthy" or closed:
        drained, outcome = _drain_node(hook, hook_reason(judged.verdict, cause, judged=not closed, job_ecc=changes))
        reason, not_drained = (outcome, "") if drained else (None, outcome)
    exit_code = hook_exit_code(judgement, hook.on_error)
    note = _record_unjudged(hook, cause) if judgement == "could-not-judge" and judged.verdict is None else ""

    elapsed = hook.now() - hook.started
    head = f"{hook.what} {hook.env.label()}"
    level_txt = f" level {hook.plan.get('level')}" if hook.plan.get("level") else ""
    action = "drained" if drained else f"not drained ({not_drained})" if not_drained else "not drained"
    exit_txt = f"exit {exit_code}" + (" (the wrapper exits 1)" if exit_code else "")
    if judgement == "healthy":
        line = f"{head}: healthy{level_txt} in {elapsed:.1f} s" + (f" ({cause})" if cause else "")
        priority = syslog.LOG_INFO
    elif judgement == "unhealthy":
        line = f"{head}: UNHEALTHY{level_txt}: {cause} -> {action}, {exit_txt}"
        priority = syslog.LOG_ERR
    else:
        line = f"{head}: could not judge{level_txt}: {cause} -> {action} (on-error {hook.on_error}), {exit_txt}"
        priority = syslog.LOG_ERR if closed else syslog.LOG_WARNING
    budget_note = hook.plan.get("budget_note")
    if budget_note and budget_note not in cause:
        line += f"; {budget_note}"
    if changes and judgement != "unhealthy":
        line += f"; ECC during the job: {', '.join(changes)}"
    if note:
        line += f"; {note}"
    line = " ".join(line.split())
    hook.say(priority, line)
    if interrupts is not None and interrupts.reason:
        hook.plan["signal"] = interrupts.reason
    return HookOutcome(exit_code=exit_code, judgement=judgement, cause=cause, verdict=judged.verdict,
                       drained=drained, reason=reason, log_line=line, plan=hook.plan, ecc_changes=changes)
