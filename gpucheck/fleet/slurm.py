"""Slurm hooks: `gpucheck slurm prolog`, `gpucheck slurm epilog`, `gpucheck slurm resume`.

Slurm runs Prolog=/Epilog= programs as root (SlurmdUser) with almost no environment: no PATH,
but SLURMD_NODENAME, SLURM_JOB_ID, SLURM_JOB_USER, SLURM_SCRIPT_CONTEXT, SLURM_CONF, the job's
GPUs (SLURM_JOB_GPUS, where GRES gives them) and, in the epilog, the job's exit code
(SLURM_JOB_EXIT_CODE2 "code:signal", SLURM_JOB_EXIT_CODE the raw wait status).

A prolog or epilog that exits non-zero makes Slurm drain the node; a failed prolog also fails
an interactive job (srun) and requeues a batch job (held). A drain reason set before the hook
exits is kept, so on an unhealthy verdict the hook drains the node itself with
`scontrol update NodeName=<node> State=DRAIN Reason="gpucheck: <cause>"` and exits 1.

Could not judge (an error result, a run cut short by the budget, a usage/config problem, a bug
in gpucheck): the node is not drained and the hook exits 0, unless the site chose fail-closed
(`--on-error fail`), in which case it drains with "gpucheck: could not judge: ..." and exits 1.
Either way one line goes to syslog (LOG_DAEMON, ident "gpucheck"), and every verdict is
appended to the history in the state directory.

`resume` resumes only nodes that are drained with a reason starting with "gpucheck:" and that
pass now; nodes drained by people or other tools are never touched.

scontrol runs through an injectable runner (argv -> (rc, stdout, stderr)); syslog through an
injectable logger, so all of this is tested without a cluster too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import syslog
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

REASON_PREFIX = "gpucheck:"
REASON_MAX = 200
JOBS_CURSOR = "slurm-jobs"
JOBS_KEPT = 64
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/slurm/bin"

Runner = Callable[[list[str]], tuple[int, str, str]]
Logger = Callable[[int, str], None]


def default_runner(argv: list[str], timeout_s: float = 30.0) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError as e:
        return 127, "", str(e)
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} did not answer within {timeout_s:g} s"
    return p.returncode, p.stdout, p.stderr


def syslog_logger(priority: int, line: str) -> None:
    """One line to syslog (silently nowhere when there is no syslog socket)."""
    syslog.openlog("gpucheck", syslog.LOG_PID, syslog.LOG_DAEMON)
    try:
        syslog.syslog(priority, line)
    finally:
        syslog.closelog()


def find_scontrol(explicit: str | None = None) -> str:
    """An absolute scontrol: hooks run without PATH, so look in the usual places too."""
    if explicit:
        return explicit
    path = os.environ.get("PATH") or ""
    found = shutil.which("scontrol", path=f"{path}:{SYSTEM_PATH}" if path else SYSTEM_PATH)
    return found or "/usr/bin/scontrol"


# -- the job's environment ------------------------------------------------------------------

@dataclass
class JobEnv:
    node: str
    job_id: str | None = None
    user: str | None = None
    context: str | None = None  # prolog_slurmd, epilog_slurmd
    gpus: list[int] | None = None  # None: all of the node's GPUs
    gpus_from: str | None = None  # the variable the GPU list came from
    gpus_note: str | None = None  # why the job's GPUs could not be used
    exit_code: int | None = None  # epilog: the job's exit code (None: unknown)
    signal: int | None = None

    @property
    def failed(self) -> bool | None:
        if self.exit_code is None and self.signal is None:
            return None
        return bool(self.exit_code) or bool(self.signal)

    def label(self) -> str:
        parts = [f"node={self.node}"]
        if self.job_id:
            parts.insert(0, f"job={self.job_id}")
        if self.user:
            parts.append(f"user={self.user}")
        return " ".join(parts)


def _gpu_indices(text: str) -> list[int] | None:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() for t in items):
        return None
    return sorted({int(t) for t in items})


def job_env(environ: Mapping[str, str], *, hostname: str | None = None) -> JobEnv:
    import socket

    node = environ.get("SLURMD_NODENAME") or hostname or socket.gethostname().split(".")[0]
    env = JobEnv(node=node, job_id=environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or None,
                 user=environ.get("SLURM_JOB_USER") or None, context=environ.get("SLURM_SCRIPT_CONTEXT") or None)
    for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        text = environ.get(var)
        if text is None or not text.strip():
            continue
        idx = _gpu_indices(text)
        if idx is None:
            env.gpus_note = f"{var}={text!r} is not a list of GPU indices: testing all GPUs"
            continue
        env.gpus, env.gpus_from, env.gpus_note = idx, var, None
        break
    ec2 = environ.get("SLURM_JOB_EXIT_CODE2")
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", ec2 or "")
    if m:
        env.exit_code, env.signal = int(m.group(1)), int(m.group(2))
    elif (environ.get("SLURM_JOB_EXIT_CODE") or "").strip().isdigit():
        status = int(environ["SLURM_JOB_EXIT_CODE"])  # a wait() status
        env.exit_code, env.signal = (status >> 8) & 0xFF, status & 0x7F
    return env


# -- scontrol ---------------------------------------------------------------------------------

@dataclass
class NodeState:
    node: str
    state: str  # e.g. IDLE+DRAIN
    reason: str  # without Slurm's " [user@time]" suffix

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state.upper().split("+")

    @property
    def ours(self) -> bool:
        return self.reason.startswith(REASON_PREFIX)


_REASON_RE = re.compile(r"\bReason=(.*?)(?:\s+\[[^\[\]]*@[^\[\]]*\])?\s*$")


def parse_show_node(text: str) -> dict[str, NodeState]:
    """`scontrol -o show node ...` (one line per node) -> {node: NodeState}."""
    out = {}
    for line in text.splitlines():
        name = re.search(r"\bNodeName=(\S+)", line)
        if not name:
            continue
        state = re.search(r"\bState=(\S+)", line)
        reason = _REASON_RE.search(line)
        out[name.group(1)] = NodeState(name.group(1), state.group(1) if state else "",
                                       reason.group(1).strip() if reason else "")
    return out


def drain_reason(cause: str) -> str:
    cause = " ".join(cause.split())
    text = f"{REASON_PREFIX} {cause}" if cause else REASON_PREFIX
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def drain(node: str, cause: str, *, scontrol: str, runner: Runner) -> tuple[bool, str]:
    reason = drain_reason(cause)
    rc, out, err = runner([scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
    if rc != 0:
        return False, f"scontrol update failed (exit {rc}): {(err or out).strip()}"
    return True, reason


# -- hooks ----------------------------------------------------------------------------------

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
    on_error: str | None = None  # pass | fail; None: the config's run.on_error, else pass
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


PROLOG_DEFAULTS = {"level": "1", "budget_s": 15.0}
EPILOG_DEFAULTS = {"checks": ["xid", "ecc", "memory-remap"], "budget_s": 60.0, "failed_level": "2",
                   "failed_budget_s": 600.0}


@dataclass
class HookOutcome:
    exit_code: int
    judgement: str  # healthy | unhealthy | could-not-judge
    cause: str
    verdict: dict[str, Any] | None = None
    drained: bool = False
    reason: str | None = None
    log_line: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    ecc_changes: list[str] = field(default_factory=list)


def _expand(template: str | None, node: str) -> str | None:
    return template.replace("{node}", node) if template else template


def ecc_by_uuid(verdict: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """{gpu uuid (else gpuN): {counter: value}}: the error counters (unit "count") of a verdict's
    ecc results."""
    if not verdict:
        return {}
    uuids = {g.get("index"): g.get("uuid") for g in verdict.get("gpus", []) if isinstance(g, dict)}
    out: dict[str, dict[str, float]] = {}
    for r in verdict.get("results", []):
        if not isinstance(r, dict) or r.get("check") != "ecc" or r.get("gpu") is None:
            continue
        key = uuids.get(r["gpu"]) or f"gpu{r['gpu']}"
        vals = {}
        for name, m in (r.get("metrics") or {}).items():
            v = m.get("value") if isinstance(m, dict) else None
            if (isinstance(m, dict) and m.get("unit") == "count" and isinstance(v, (int, float))
                    and not isinstance(v, bool)):
                vals[name] = float(v)
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


def _gpu_labels(verdict: Mapping[str, Any] | None) -> dict[str, str]:
    return {g["uuid"]: f"gpu{g['index']}" for g in (verdict or {}).get("gpus", [])
            if isinstance(g, dict) and g.get("uuid") and isinstance(g.get("index"), int)}


def _run_gpucheck(req, execute) -> tuple[int, dict[str, Any] | None]:
    """Run the pipeline, capturing the verdict through --output (a private temporary file)."""
    fd, tmp = tempfile.mkstemp(prefix="gpucheck-hook-", suffix=".json")
    os.close(fd)
    req.output = tmp
    try:
        code = execute(req)
        try:
            text = Path(tmp).read_text(encoding="utf-8")
            verdict = json.loads(text) if text.strip() else None
        except (OSError, ValueError):
            verdict = None
        return code, verdict
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _job_start(env: JobEnv, state, scontrol: str, runner: Runner) -> tuple[float | None, dict[str, Any] | None, str]:
    """When the job started (the prolog's record, else scontrol's StartTime) and the prolog's ECC reading."""
    if env.job_id and state is not None:
        jobs = state.read_cursor(JOBS_CURSOR) or {}
        rec = jobs.get(env.job_id) if isinstance(jobs, dict) else None
        if isinstance(rec, dict) and isinstance(rec.get("start"), (int, float)):
            return float(rec["start"]), rec.get("ecc") or {}, "prolog record"
    if env.job_id:
        rc, out, _ = runner([scontrol, "-o", "show", "job", env.job_id])
        m = re.search(r"\bStartTime=(\S+)", out) if rc == 0 else None
        if m:
            from ..kernlog.timeparse import parse_timestamp

            start = parse_timestamp(m.group(1))
            if start is not None:
                return start, None, "scontrol StartTime"
    return None, None, "unknown"


def _remember_job(state, env: JobEnv, start: float, verdict: dict[str, Any] | None) -> None:
    if not env.job_id or state is None:
        return
    jobs = state.read_cursor(JOBS_CURSOR)
    jobs = jobs if isinstance(jobs, dict) else {}
    jobs[env.job_id] = {"start": start, "ecc": ecc_by_uuid(verdict)}
    if len(jobs) > JOBS_KEPT:
        for old in sorted(jobs, key=lambda k: jobs[k].get("start", 0) if isinstance(jobs[k], dict) else 0)[:-JOBS_KEPT]:
            del jobs[old]
    state.write_cursor(JOBS_CURSOR, jobs)


def _forget_job(state, env: JobEnv) -> None:
    if not env.job_id or state is None:
        return
    jobs = state.read_cursor(JOBS_CURSOR)
    if isinstance(jobs, dict) and env.job_id in jobs:
        del jobs[env.job_id]
        state.write_cursor(JOBS_CURSOR, jobs)


def run_hook(
    opts: HookOptions,
    environ: Mapping[str, str],
    *,
    runner: Runner = default_runner,
    log: Logger = syslog_logger,
    execute: Callable[..., int] | None = None,
    now: Callable[[], float] = time.time,
) -> HookOutcome:
    """Run the prolog or epilog for the job described by `environ`; drain on unhealthy."""
    from ..app import RunRequest
    from ..config import ConfigError, load_config
    from ..state import State, default_state_dir
    from .sweep import verdict_cause

    if execute is None:
        from ..app import execute
    started = now()
    env = job_env(environ)
    scontrol = find_scontrol(opts.scontrol)
    what = f"slurm {opts.kind}"
    plan: dict[str, Any] = {"node": env.node, "job": env.job_id}

    on_error = opts.on_error
    config_problem = None
    try:
        config_on_error = load_config(opts.config_path).run.get("on_error", "pass")
    except ConfigError as e:
        config_on_error, config_problem = "pass", str(e)
    on_error = on_error or config_on_error
    if on_error not in ("pass", "fail"):
        on_error = "pass"

    state_root = _expand(opts.state_dir, env.node) or str(default_state_dir())
    state = State(state_root)
    verdict = None
    changes: list[str] = []
    try:
        defaults = PROLOG_DEFAULTS if opts.kind == "prolog" else EPILOG_DEFAULTS
        level = opts.level or defaults.get("level")
        checks = list(opts.checks) or list(defaults.get("checks", []))
        budget = opts.budget_s if opts.budget_s is not None else defaults["budget_s"]
        options: dict[str, Any] = {}
        prior_ecc: dict[str, Any] | None = None
        if opts.kind == "epilog":
            start, prior_ecc, start_from = _job_start(env, state, scontrol, runner)
            if start is not None:
                options["xid_since"] = f"@{start:.3f}"
            plan.update(job_start=start, job_start_from=start_from, job_failed=env.failed)
            if env.failed:
                level = opts.failed_level or defaults["failed_level"]
                checks = list(opts.failed_checks)
                budget = opts.failed_budget_s if opts.failed_budget_s is not None else defaults["failed_budget_s"]
        gpus = None if opts.all_gpus else env.gpus
        plan.update(level=level, checks=checks, budget_s=budget, gpus=gpus, gpus_from=env.gpus_from,
                    gpus_note=env.gpus_note, on_error=on_error)
        req = RunRequest(level=level, check_patterns=checks, skip_patterns=list(opts.skips), gpus=gpus,
                         device=opts.device, workers=opts.workers, options=options, json=opts.as_json,
                         strict=opts.strict, on_error="pass", config_path=opts.config_path,
                         snapshot_path=_expand(opts.snapshot, env.node), state_dir=state_root,
                         timeout_s=budget, history=True)
        code, verdict = _run_gpucheck(req, execute)
        if opts.kind == "prolog":
            try:
                _remember_job(state, env, started, verdict)
            except OSError:
                pass
        else:
            changes = ecc_changes(prior_ecc or {}, ecc_by_uuid(verdict), _gpu_labels(verdict))
            try:
                _forget_job(state, env)
            except OSError:
                pass
        if code == 0:
            warned = verdict is not None and verdict.get("status") == "warn"
            judgement, cause = "healthy", verdict_cause(verdict) if warned else ""
        elif code == 1:
            judgement, cause = "unhealthy", verdict_cause(verdict) if verdict else "unhealthy"
        elif code == 2:
            judgement, cause = "could-not-judge", config_problem or "usage or configuration error (see stderr)"
        else:
            judgement, cause = "could-not-judge", verdict_cause(verdict) if verdict else f"exit {code}"
    except Exception as e:  # gpucheck's own bug: never let it take the node down by itself
        judgement = "could-not-judge"
        cause = f"internal error: {type(e).__name__}: {e}"
        plan["traceback"] = traceback.format_exc(limit=5)

    if judgement == "unhealthy" and changes:  # the most specific news first: the reason is cut at REASON_MAX
        cause = f"during job {env.job_id}: {', '.join(changes)}; {cause}"
    if judgement == "could-not-judge" and on_error == "fail":
        cause = f"could not judge: {cause}"
        judgement = "unhealthy"

    drained, reason, exit_code = False, None, 0
    if judgement == "unhealthy":
        exit_code = 1
        if opts.drain:
            drained, reason = drain(env.node, cause, scontrol=scontrol, runner=runner)
            if not drained:
                log(syslog.LOG_ERR, f"{what} {env.label()}: cannot drain: {reason}")
                reason = None

    elapsed = now() - started
    level_txt = f" level {plan.get('level')}" if plan.get("level") else ""
    action = "drained" if drained else ("not drained (--no-drain)" if judgement == "unhealthy" and not opts.drain
                                        else "not drained")
    if judgement == "healthy":
        line = f"{what} {env.label()}: healthy{level_txt} in {elapsed:.1f} s" + (f" ({cause})" if cause else "")
        priority = syslog.LOG_INFO
    elif judgement == "unhealthy":
        line = f"{what} {env.label()}: UNHEALTHY{level_txt}: {cause} -> {action}, exit 1"
        priority = syslog.LOG_ERR
    else:
        line = (f"{what} {env.label()}: could not judge{level_txt}: {cause} -> not drained "
                f"(on-error {on_error}), exit 0")
        priority = syslog.LOG_WARNING
    if changes and judgement != "unhealthy":
        line += f"; ECC during the job: {', '.join(changes)}"
    log(priority, line)
    return HookOutcome(exit_code=exit_code, judgement=judgement, cause=cause, verdict=verdict, drained=drained,
                       reason=reason, log_line=line, plan=plan, ecc_changes=changes)


# -- resume ---------------------------------------------------------------------------------

@dataclass
class ResumeDecision:
    node: str
    state: str
    reason: str
    decision: str  # resumed | still-bad | not-ours | not-drained | unknown | would-resume | interrupted
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "state": self.state, "reason": self.reason, "decision": self.decision,
                "detail": self.detail}


def node_states(nodes: list[str], *, scontrol: str, runner: Runner) -> dict[str, NodeState]:
    from .nodeset import fold

    rc, out, err = runner([scontrol, "-o", "show", "node", fold(nodes)])
    if rc != 0 and not out.strip():
        raise RuntimeError(f"scontrol show node failed (exit {rc}): {(err or '').strip()}")
    return parse_show_node(out)


def plan_resume(nodes: list[str], states: Mapping[str, NodeState]) -> tuple[list[str], list[ResumeDecision]]:
    """Which nodes are candidates (drained by gpucheck); decisions for the others."""
    candidates, others = [], []
    for n in nodes:
        st = states.get(n)
        if st is None:
            others.append(ResumeDecision(n, "", "", "unknown", "scontrol does not know this node"))
        elif not st.drained:
            others.append(ResumeDecision(n, st.state, st.reason, "not-drained"))
        elif not st.ours:
            others.append(ResumeDecision(n, st.state, st.reason, "not-ours",
                                         "drained by someone else: left alone"))
        else:
            candidates.append(n)
    return candidates, others


def resume_nodes(
    nodes: list[str],
    *,
    test: Callable[[list[str]], Mapping[str, tuple[bool, str]]],
    scontrol: str,
    runner: Runner,
    dry_run: bool = False,
    log: Logger = syslog_logger,
) -> list[ResumeDecision]:
    """Resume the nodes of `nodes` that gpucheck drained and that pass `test` now.

    test(candidates) -> {node: (passes, why)}: a sweep of the candidates. A stop (SIGTERM/SIGINT,
    gpucheck.processes) resumes nothing more: test() raising Interrupted (with the nodes that
    answered as `partial`), or a signal while resuming, makes every candidate not yet resumed
    `interrupted` (`still-bad` when its answer was bad).
    """
    from ..processes import Interrupted, stopping

    states = node_states(nodes, scontrol=scontrol, runner=runner)
    candidates, decisions = plan_resume(nodes, states)
    try:
        results = test(candidates) if candidates and not stopping() else {}
    except Interrupted as e:
        results = dict(e.partial or {})
    for n in candidates:
        st = states[n]
        ok, why = results.get(n, (False, "not tested"))
        signame = stopping()
        if signame and (ok or n not in results):
            what = f"passes ({why}) but" if ok else "not tested:"
            decisions.append(ResumeDecision(n, st.state, st.reason, "interrupted",
                                            f"{what} not resumed: interrupted by {signame}"))
            continue
        if not ok:
            decisions.append(ResumeDecision(n, st.state, st.reason, "still-bad", why))
            continue
        if dry_run:
            decisions.append(ResumeDecision(n, st.state, st.reason, "would-resume", why))
            continue
        # Re-read the reason just before resuming: someone may have re-drained it meanwhile.
        now_state = node_states([n], scontrol=scontrol, runner=runner).get(n)
        if now_state is None or not now_state.drained or not now_state.ours:
            decisions.append(ResumeDecision(n, now_state.state if now_state else "",
                                            now_state.reason if now_state else "", "not-ours",
                                            "reason changed while testing: left alone"))
            continue
        rc, out, err = runner([scontrol, "update", f"NodeName={n}", "State=RESUME"])
        if rc != 0:
            decisions.append(ResumeDecision(n, st.state, st.reason, "still-bad",
                                            f"scontrol update failed (exit {rc}): {(err or out).strip()}"))
            continue
        decisions.append(ResumeDecision(n, st.state, st.reason, "resumed", why))
        log(syslog.LOG_INFO, f"slurm resume node={n}: passes now, resumed (was drained: {st.reason})")
    order = {n: i for i, n in enumerate(nodes)}
    decisions.sort(key=lambda d: order.get(d.node, 0))
    return decisions
