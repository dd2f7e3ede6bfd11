"""Slurm: `gpucheck slurm resume`, and what the hooks (gpucheck.fleet.hook) share with it:
the job's environment, scontrol (node states, drain) and syslog.

Slurm runs Prolog=/Epilog= programs as root (SlurmdUser) with almost no environment: no PATH,
but SLURMD_NODENAME, SLURM_JOB_ID, SLURM_JOB_USER, SLURM_SCRIPT_CONTEXT, SLURM_CONF, the job's
GPUs (SLURM_JOB_GPUS, where GRES gives them) and, in the epilog, the job's exit code
(SLURM_JOB_EXIT_CODE2 "code:signal", SLURM_JOB_EXIT_CODE the raw wait status).

`resume` resumes only nodes that are drained with a reason starting with "gpucheck:" and that
pass now; nodes drained by people or other tools are never touched.

scontrol runs through an injectable runner (argv -> (rc, stdout, stderr)); syslog through an
injectable logger, so all of this is tested without a cluster too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import syslog
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..core.reason import REASON_MAX, REASON_PREFIX, reason_text  # noqa: F401 - REASON_MAX: re-exported

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/slurm/bin"
_NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

Runner = Callable[[list[str]], tuple[int, str, str]]
Logger = Callable[[int, str], None]


def default_runner(argv: list[str], timeout_s: float = 30.0) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError as e:
        return 127, "", str(e)
    except OSError as e:  # not executable, ...: a failed call, never an exception out of a hook
        return 126, "", str(e)
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


# -- Slurm's PrologEpilogTimeout ------------------------------------------------------------

_TIMEOUT_RE = re.compile(r"^PrologEpilogTimeout\s*=\s*(\S+)\s*$", re.M)
NO_TIMEOUT = 65534  # and above: Slurm's "not set" (NO_VAL16) and "unlimited"


def prolog_epilog_timeout(scontrol: str, runner: Runner) -> tuple[float | None, str]:
    """Slurm's PrologEpilogTimeout in seconds, from `scontrol show config` (None: none is set, or
    it cannot be read; the second value says which). Past it Slurm 22.05 ends a hook with SIGKILL
    ("prolog killed by signal 9") and drains the node, whatever the hook would have decided."""
    rc, out, err = runner([scontrol, "show", "config"])
    if rc != 0:
        return None, f"unknown (scontrol show config exit {rc}: {' '.join((err or out).split())[:160]})"
    m = _TIMEOUT_RE.search(out)
    if m is None:
        return None, "unknown (no PrologEpilogTimeout in scontrol show config)"
    value = m.group(1)
    if not re.fullmatch(r"[0-9]{1,5}", value) or int(value) >= NO_TIMEOUT or int(value) == 0:
        return None, f"none (PrologEpilogTimeout = {value})"
    return float(value), f"PrologEpilogTimeout = {value} (scontrol show config)"


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


_ASCII_NUMBER = re.compile(r"[0-9]{1,9}")  # str.isdigit() takes '²' (int() refuses it) and '٣' (int() reads 3)


def _gpu_indices(text: str) -> list[int] | None:
    """'0,2,3' -> [0, 2, 3]; None when an item is no plain ASCII number."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(_ASCII_NUMBER.fullmatch(t) for t in items):
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
    m = re.fullmatch(r"\s*([0-9]{1,9}):([0-9]{1,9})\s*", ec2 or "")
    raw_status = (environ.get("SLURM_JOB_EXIT_CODE") or "").strip()
    if m:
        env.exit_code, env.signal = int(m.group(1)), int(m.group(2))
    elif _ASCII_NUMBER.fullmatch(raw_status):
        status = int(raw_status)  # a wait() status
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
    """The reason text scontrol gets (gpucheck.core.reason.reason_text: printable ASCII,
    "gpucheck:" first, at most 60 characters; a reason the hook built with hook_reason passes
    through unchanged)."""
    return reason_text(cause)


def drain(node: str, cause: str, *, scontrol: str, runner: Runner) -> tuple[bool, str]:
    if not _NODE_NAME_RE.fullmatch(node):  # "n[1-99]" or "a,b" would drain many nodes
        return False, f"refusing to drain {node!r}: not a single node name"
    reason = drain_reason(cause)
    rc, out, err = runner([scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
    if rc == 127:
        return False, f"scontrol not found ({scontrol}: {(err or out).strip()})"
    if rc != 0:
        return False, f"scontrol update failed (exit {rc}): {(err or out).strip()}"
    return True, reason



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
    from ..platform.nodeset import fold

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
    gpucheck.platform.processes) resumes nothing more: test() raising Interrupted (with the nodes that
    answered as `partial`), or a signal while resuming, makes every candidate not yet resumed
    `interrupted` (`still-bad` when its answer was bad).
    """
    from ..platform.processes import Interrupted, stopping

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



def resume_exit_code(decisions: list[ResumeDecision]) -> int:
    """3 when a signal stopped the resume, 1 when a node gpucheck drained still fails, else 0."""
    if any(d.decision == "interrupted" for d in decisions):
        return 3
    return 1 if any(d.decision == "still-bad" for d in decisions) else 0


def sweep_test(nodes: list[str], opts: Any, sweep: Callable[[Any], Any]) -> Callable[[list[str]], dict[str, tuple[bool, str]]]:
    """The test resume_nodes runs on its candidates: `sweep` (plan -> gpucheck.fleet.sweep.SweepRun)
    of the candidates with the remote options `opts` (gpucheck.fleet.remote.RemoteOptions); a
    node passes when its outcome is not bad. A stop raises processes.Interrupted with the
    answers of the nodes that answered."""
    from ..platform.processes import Interrupted
    from .remote import build_plan

    def test(candidates: list[str]) -> dict[str, tuple[bool, str]]:
        run = sweep(build_plan(nodes, opts, subset=candidates))
        judged = {o.node: (not o.is_bad(opts.strict), f"{o.status}" + (f": {o.reason}" if o.reason else ""))
                  for o in run.outcomes}
        if run.interrupted:
            raise Interrupted(run.interrupted, partial=judged)
        return judged

    return test
