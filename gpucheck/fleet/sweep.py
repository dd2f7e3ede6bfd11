"""A sweep: `gpucheck run --json` on many nodes, each node's output turned into a node status.

Node statuses: the verdict's own (`pass`, `warn`, `skip`, `fail`; `error` when the node could
not judge itself, verdict exit code 3), or, when there is no verdict, `unreachable` (ssh could
not reach the node: exit 255), `timeout` (killed at the per-node timeout) or `error` (gpucheck
missing, a usage error on the node, output that is not a verdict). Each comes with a one-line
reason; none of them is ever `pass`.

Everything here but `run_sweep` is pure: plain data in, plain data out.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .fanout import NodeRun

GOOD = ("pass", "warn", "skip")
BAD = ("fail", "error", "unreachable", "timeout")
NODE_STATUSES = (*GOOD, *BAD)
_RANK = {"skip": 0, "pass": 1, "warn": 2, "error": 3, "timeout": 4, "unreachable": 5, "fail": 6}
VERDICT_SCHEMA = "gpucheck.verdict"
_VERSION_RE = re.compile(r"^1\.\d+$")
REPORT_SCHEMA = "gpucheck.sweep"
REPORT_SCHEMA_VERSION = "1.0"
SNIPPET = 200


@dataclass
class NodeOutcome:
    node: str
    status: str
    reason: str
    action: str = "none"
    failing: list[str] = field(default_factory=list)  # "check" or "check:subject"
    rc: int | None = None
    duration_s: float = 0.0
    verdict: dict[str, Any] | None = None
    stderr_tail: str = ""
    fleet: list[str] = field(default_factory=list)  # findings of the fleet comparison

    def is_bad(self, strict: bool = False) -> bool:
        return self.status in BAD or (strict and self.status == "warn")

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "status": self.status,
            "reason": self.reason,
            "action": self.action,
            "failing": list(self.failing),
            "fleet": list(self.fleet),
            "rc": self.rc,
            "duration_s": self.duration_s,
            "stderr_tail": self.stderr_tail,
            "verdict": self.verdict,
        }


def remote_command(remote_cmd: str, run_args: list[str], extra: str = "") -> str:
    """The shell text run on a node: `<remote_cmd> run --json <args> <extra>`.

    remote_cmd is shell text on purpose (`/opt/gpucheck/bin/gpucheck`, `env X=1 python3 -m
    gpucheck`); run_args are quoted; extra (per-node arguments) is re-quoted after shell
    splitting, so a malformed quote is a ValueError here and not a surprise on the node.
    """
    parts = [remote_cmd.strip(), "run", "--json"]
    if run_args:
        parts.append(shlex.join(run_args))
    if extra.strip():
        parts.append(shlex.join(shlex.split(extra)))
    return " ".join(parts)


# The node-side limit's SIGKILL follows its SIGTERM after twice the runner's cancel grace
# (gpucheck.runner.CANCEL_GRACE_S, 5 s): time for the node's gpucheck to stop its checks.
NODE_KILL_AFTER_S = 10
# ssh -n or srun --input=none give the command no standard input: it reads end-of-file within
# the session's start. An end-of-file this long after the start is the session ending.
NO_STDIN_S = 2


def die_with_session(command: str, timeout_s: float | None) -> str:
    """`command` (shell text) wrapped so that it dies with its ssh session or srun step and
    never outlives the sweep's `timeout_s` on the node.

    The command runs in the background under `timeout -k 10 <timeout_s>` (coreutils, where the
    node has it: SIGTERM at the limit, SIGKILL 10 s later, to the command's whole process
    group), and a watcher reads the session's standard input, which the fan-out keeps open and
    never writes: when the local ssh or srun client is killed (the sweep's --timeout, a
    SIGTERM/SIGINT of the sweep), the session closes it, the watcher reads end-of-file and sends
    SIGTERM to the command (timeout passes it on and arms its SIGKILL). An end-of-file within
    NO_STDIN_S of the start means there was no standard input at all (ssh -n): the command is
    then left to its time limit. The exit status is the command's (124: the node-side limit)."""
    limit = ""
    if timeout_s:
        limit = (f"command -v timeout >/dev/null 2>&1 && "
                 f"set -- timeout -k {NODE_KILL_AFTER_S} {max(1, math.ceil(timeout_s))}; ")
    return ("exec 3<&0 </dev/null; s=$(date +%s); set --; " + limit
            + f'"$@" sh -c {shlex.quote(command)} & p=$!; '
            + f'{{ IFS= read -r _ <&3; [ $(($(date +%s) - s)) -ge {NO_STDIN_S} ] && kill -TERM "$p"; }} '
            + '>/dev/null 2>&1 & w=$!; exec 3<&-; wait "$p"; r=$?; kill "$w" 2>/dev/null; exit "$r"')


def one_line(command: str) -> str:
    """`command` wrapped so that its standard output crosses the wire as one line, exit status
    kept: `sh -c 'out=$(COMMAND); rc=$?; printf %s "$out" | tr -d "\\n"; echo; exit $rc'`.

    A verdict is indented JSON (thousands of lines for an 8-GPU node); the fan-out handles
    output line by line, which costs more than the remote run itself on a large sweep. JSON
    strings never hold a raw newline, so dropping them changes no value. Running under `sh -c`
    also makes the command independent of the user's login shell."""
    script = f'out=$({command}); rc=$?; printf "%s" "$out" | tr -d "\\n"; echo; exit $rc'
    return "sh -c " + shlex.quote(script)


def parse_verdict(text: str) -> tuple[dict[str, Any] | None, str]:
    """(verdict, "") when `text` is one gpucheck verdict document of schema 1.x, else (None, why)."""
    s = text.strip()
    if not s:
        return None, "no output"
    try:
        doc = json.loads(s)
    except ValueError:
        return None, f"not a verdict: {_snippet(s)}"
    if not isinstance(doc, dict) or doc.get("schema") != VERDICT_SCHEMA:
        return None, f"not a verdict: {_snippet(s)}"
    version = str(doc.get("schema_version", ""))
    if not _VERSION_RE.match(version):
        return None, f"verdict schema_version {version or '?'} is not supported (want 1.x)"
    missing = [k for k in ("host", "status", "exit_code", "results", "action") if k not in doc]
    if missing:
        return None, f"not a verdict: missing {', '.join(missing)}"
    if doc["status"] not in ("pass", "warn", "fail", "skip", "error") or doc["exit_code"] not in (0, 1, 3) \
            or not isinstance(doc["results"], list):
        return None, f"not a verdict: bad status/exit_code/results ({_snippet(s)})"
    return doc, ""


def _snippet(s: str) -> str:
    s = " ".join(s.split())
    return s[:SNIPPET] + ("..." if len(s) > SNIPPET else "")


def _last_line(s: str) -> str:
    lines = [ln.strip() for ln in s.splitlines() if ln.strip()]
    return _snippet(lines[-1]) if lines else ""


def failing_results(verdict: dict[str, Any]) -> list[dict[str, Any]]:
    """The results that make a verdict bad: fails first, then errors."""
    rs = [r for r in verdict.get("results", []) if isinstance(r, dict)]
    return [r for r in rs if r.get("status") == "fail"] + [r for r in rs if r.get("status") == "error"]


def _label(r: dict[str, Any]) -> str:
    subj = r.get("subject")
    return f"{r.get('check')}:{subj}" if subj and subj != "node" else str(r.get("check"))


def classify(run: NodeRun, *, timeout_s: float | None = None) -> NodeOutcome:
    """One node's status from what its command did."""
    base = dict(node=run.node, rc=run.rc, duration_s=run.duration_s, stderr_tail=_last_line(run.stderr))
    if run.timed_out:
        limit = f" within {timeout_s:g} s" if timeout_s else ""
        return NodeOutcome(status="timeout", reason=f"no answer{limit} (killed)", action="investigate", **base)

    verdict, why = parse_verdict(run.stdout)
    if verdict is None:
        err = _last_line(run.stderr)
        if run.via == "ssh" and run.rc == 255:
            return NodeOutcome(status="unreachable", reason=err or "ssh failed (exit 255)",
                               action="investigate", **base)
        if run.rc == 127:
            reason = "gpucheck not installed" + (f" ({err})" if err else "")
        elif run.rc == 126:
            reason = "gpucheck cannot be executed" + (f" ({err})" if err else "")
        elif run.rc == 2 and not run.stdout.strip():
            reason = "usage error on the node" + (f": {err}" if err else "")
        elif why == "no output":
            reason = f"no verdict (exit {run.rc})" + (f": {err}" if err else "")
        else:
            reason = why
        return NodeOutcome(status="error", reason=reason, action="investigate", **base)

    bad = failing_results(verdict)
    status = verdict["status"]
    if verdict["exit_code"] == 3 and status != "fail":
        status = "error"  # could not judge (an error result, or a partial run)
    elif verdict["exit_code"] == 1 and status in GOOD:
        status = "fail"  # --strict turned a warn into unhealthy on the node
    reason = verdict_cause(verdict) if status not in ("pass", "skip") else ""
    return NodeOutcome(status=status, reason=reason, action=str(verdict.get("action", "none")),
                       failing=[_label(r) for r in bad], verdict=verdict, **base)


def verdict_cause(verdict: Mapping[str, Any]) -> str:
    """One line naming why a verdict is not a plain pass: its first fail (else error, else
    unexamined skip, else warn) result, or the interruption of a partial run."""
    results = [r for r in verdict.get("results", []) if isinstance(r, dict)]
    bad = [r for r in results if r.get("status") == "fail"] or \
          [r for r in results if r.get("status") == "error"] or \
          [r for r in results if r.get("unexamined")] or \
          [r for r in results if r.get("status") == "warn"]
    if not bad:
        if verdict.get("partial"):
            return f"run cut short ({verdict.get('interrupted')})"
        return str(verdict.get("status", "?"))
    first = bad[0]
    subj = first.get("subject")
    where = f" {subj}" if subj and subj != "node" else ""
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"{first.get('check')}{where}: {first.get('summary', '')}{more}"


def failing_text(failing: list[str]) -> str:
    """["ecc:gpu0", "ecc:gpu3", "xid"] -> "ecc[gpu0,gpu3], xid"."""
    groups: dict[str, list[str]] = {}
    for item in failing:
        check, _, subj = item.partition(":")
        groups.setdefault(check, [])
        if subj:
            groups[check].append(subj)
    return ", ".join(f"{c}[{','.join(s)}]" if s else c for c, s in groups.items())


def worst(statuses: list[str]) -> str:
    return max(statuses, key=lambda s: _RANK.get(s, 0)) if statuses else "skip"


@dataclass
class SweepPlan:
    """What to run where."""

    nodes: list[str]
    remote_cmd: str = "gpucheck"
    run_args: list[str] = field(default_factory=list)
    node_args: dict[str, str] = field(default_factory=dict)
    mode: str = "ssh"
    fanout: int | None = None
    timeout_s: float | None = None

    def commands(self) -> dict[str, str]:
        return {n: one_line(die_with_session(remote_command(self.remote_cmd, self.run_args,
                                                            self.node_args.get(n, "")), self.timeout_s))
                for n in self.nodes}


def run_sweep(
    plan: SweepPlan,
    *,
    runner: Callable[..., Mapping[str, NodeRun]],
    on_node: Callable[[NodeOutcome], None] | None = None,
    **runner_kw: Any,
) -> tuple[list[NodeOutcome], float]:
    """Fan the command out with `runner` (gpucheck.fleet.fanout.run_nodes), classify every node.

    Returns the outcomes in node order and the wall time.
    """
    t0 = time.monotonic()
    seen: dict[str, NodeOutcome] = {}

    def done(run: NodeRun) -> None:
        seen[run.node] = outcome = classify(run, timeout_s=plan.timeout_s)
        if on_node is not None:
            on_node(outcome)

    runs = runner(plan.commands(), mode=plan.mode, fanout=plan.fanout, timeout_s=plan.timeout_s,
                  on_done=done, **runner_kw)
    outcomes = [seen.get(n) or classify(runs[n], timeout_s=plan.timeout_s) for n in plan.nodes]
    return outcomes, time.monotonic() - t0


def apply_fleet(outcomes: list[NodeOutcome], findings: Mapping[str, list[str]]) -> None:
    """Attach the fleet comparison's findings; a node that passed on its own but is an outlier
    among its peers (slow, or bits that differ from the majority) becomes `fail`."""
    for o in outcomes:
        items = list(findings.get(o.node, []))
        if not items:
            continue
        o.fleet = items
        if o.status in GOOD:
            o.status = "fail"
            o.reason = o.reason or f"fleet: {items[0]}"
            if o.action == "none":
                o.action = "investigate"


def build_report(
    outcomes: list[NodeOutcome],
    comparison: dict[str, Any],
    *,
    plan: SweepPlan,
    started_at: float,
    duration_s: float,
    strict: bool = False,
) -> dict[str, Any]:
    """The sweep report (`--report FILE`): every node's verdict plus the fleet comparison."""
    from ..verdict import iso_utc
    from .nodeset import fold

    counts = {s: 0 for s in NODE_STATUSES}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    bad = [o.node for o in outcomes if o.is_bad(strict)]
    by_status = {s: fold(o.node for o in outcomes if o.status == s) for s in NODE_STATUSES}
    return {
        "schema": REPORT_SCHEMA,
        "schema_version": REPORT_SCHEMA_VERSION,
        "time": iso_utc(started_at),
        "duration_s": round(duration_s, 3),
        "nodeset": fold(plan.nodes),
        "mode": plan.mode,
        "command": plan.remote_cmd,
        "run_args": list(plan.run_args),
        "node_args": dict(plan.node_args),
        "fanout": plan.fanout,
        "timeout_s": plan.timeout_s,
        "strict": strict,
        "counts": counts,
        "bad": fold(bad),
        "by_status": {s: v for s, v in by_status.items() if v},
        "exit_code": 1 if bad else 0,
        "fleet": comparison,
        "nodes": [o.to_dict() for o in outcomes],
    }
