"""A sweep: `gpucheck run --json` on many nodes, each node's output turned into a node status.

Node statuses: the verdict's own (`pass`, `warn`, `skip`, `fail`; `error` when the node could
not judge itself, verdict exit code 3), or, when there is no verdict, `unreachable` (ssh could
not reach the node: exit 255), `timeout` (killed at the per-node timeout) or `error` (gpucheck
missing, a usage error on the node, output that is not a verdict, a verdict that breaks the
schema or contradicts itself, output over the size limit). Each comes with a one-line reason;
none of them is ever `pass`.

Memory: a sweep keeps each node's summary (NodeOutcome: status, cause, action, failing checks,
and the fleet comparison's inputs), never its verdict. `run_sweep` writes each verdict to a
VerdictSpool (an unlinked temporary file) as it arrives, and `report_chunks` writes the report
from the summaries and the spool, one node at a time.

Everything here but `run_sweep` and VerdictSpool is pure: plain data in, plain data out.
"""

from __future__ import annotations

import json
import math
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from ..core.documents import FleetInputs, NodeEntry, SweepReport, fleet_inputs
from ..core.result import ResultEntry, Status
from ..core.verdict import SCHEMA_ID, Verdict, VerdictError, iso_utc, supported_version
from ..platform import fanout
from ..platform.argv import option_value
from ..platform.durations import parse_duration
from ..platform.fanout import MAX_OUTPUT_BYTES, NodeRun, session_stdin
from ..platform.nodeset import fold
from ..platform.processes import Interrupted
from ..platform.snippets import last_line, snippet
from . import compare
from .compare import FleetComparison, FleetFinding

GOOD = ("pass", "warn", "skip")
BAD = ("fail", "error", "unreachable", "timeout")
NODE_STATUSES = (*GOOD, *BAD)
_RANK = {"skip": 0, "pass": 1, "warn": 2, "error": 3, "timeout": 4, "unreachable": 5, "fail": 6}
REPORT_SCHEMA = "gpucheck.sweep"
REPORT_SCHEMA_VERSION = "1.1"  # 1.1: each node entry's "checks" (its grid row)


@dataclass
class NodeOutcome:
    node: str
    status: str
    reason: str
    action: str = "none"
    failing: list[str] = field(default_factory=list)  # "check" or "check:subject"
    rc: int | None = None
    duration_s: float = 0.0
    verdict: Verdict | None = None  # set by classify; run_sweep spools it and drops it
    stderr_tail: str = ""
    fleet: list[str] = field(default_factory=list)  # findings of the fleet comparison
    inputs: FleetInputs | None = None  # what the fleet comparison reads of the verdict
    checks: tuple[tuple[str, str], ...] = ()  # (check, folded status) for the node x check grid

    def is_bad(self, strict: bool = False) -> bool:
        return self.status in BAD or (strict and self.status == "warn")

    def to_dict(self) -> NodeEntry:
        """The node's report entry but its verdict (report_chunks adds that from the spool)."""
        return {
            "node": self.node,
            "status": self.status,
            "reason": self.reason,
            "action": self.action,
            "failing": list(self.failing),
            "fleet": list(self.fleet),
            "checks": dict(self.checks),
            "rc": self.rc,
            "duration_s": self.duration_s,
            "stderr_tail": self.stderr_tail,
        }


def remote_command(remote_cmd: str, run_args: list[str], extra: str = "", timeout_s: float | None = None) -> str:
    """The shell text run on a node: `<remote_cmd> run --json <args> <extra> [--timeout S]`.

    remote_cmd is shell text on purpose (`/opt/gpucheck/bin/gpucheck`, `env X=1 python3 -m
    gpucheck`); run_args are quoted; extra (per-node arguments) is re-quoted after shell
    splitting, so a malformed quote is a ValueError here and not a surprise on the node. With
    the sweep's `timeout_s`, the run gets its own deadline last (node_run_timeout_s), so that it
    stops by itself even where nothing on the node stops it (no coreutils `timeout`, a limit
    that died).
    """
    parts = [remote_cmd.strip(), "run", "--json"]
    extra_args = shlex.split(extra) if extra.strip() else []
    if run_args:
        parts.append(shlex.join(run_args))
    if extra_args:
        parts.append(shlex.join(extra_args))
    deadline_s = node_run_timeout_s(timeout_s, [*run_args, *extra_args])
    if deadline_s is not None:
        parts.append(f"--timeout {deadline_s:g}s")
    return " ".join(parts)


# The node run's own deadline ends this long (a tenth of the sweep's limit at most) before the
# sweep's, so that its partial verdict still comes back.
NODE_RUN_MARGIN_S = 5.0


def node_run_timeout_s(timeout_s: float | None, run_args: list[str]) -> float | None:
    """The `--timeout` (whole seconds) a node's `gpucheck run` gets under a sweep limit of
    `timeout_s`: that limit less NODE_RUN_MARGIN_S (a tenth of it at most), at least 1 s, or the
    run's own `--timeout` among `run_args` where that is shorter. None without a limit."""
    if not timeout_s:
        return None
    limit = max(1, math.floor(timeout_s - min(NODE_RUN_MARGIN_S, timeout_s / 10)))
    asked = option_value(run_args, "--timeout")  # the last one: the one the run reads
    try:
        asked_s = parse_duration(asked) if asked is not None else None
    except ValueError:
        asked_s = None  # replaced by this deadline
    return float(limit if asked_s is None else min(limit, max(1, math.ceil(asked_s))))


# The node-side limit's SIGKILL follows its SIGTERM after twice the runner's cancel grace
# (gpucheck.core.runner.CANCEL_GRACE_S, 5 s): time for the node's gpucheck to stop its checks.
NODE_KILL_AFTER_S = 10


def die_with_session(command: str, timeout_s: float | None, session_stdin: bool = True) -> str:
    """`command` (shell text) wrapped so that it never outlives the sweep's `timeout_s` on the
    node and, with `session_stdin`, dies with its ssh session or srun step.

    The command runs under `timeout -k 10 <timeout_s>` (coreutils, where the node has it: SIGTERM
    at the limit, SIGKILL 10 s later, to the command's whole process group). `session_stdin`
    says that the command's standard input is the session's (gpucheck.platform.fanout.session_stdin:
    the fan-out keeps it open and never writes it): the command then runs in the background and a
    watcher reads that input; when the local ssh or srun client is killed (the sweep's
    --timeout, a SIGTERM/SIGINT of the sweep), the session closes it, the watcher reads
    end-of-file, at any moment from the start on, and sends SIGTERM to the command (timeout
    passes it on and arms its SIGKILL). Without a session input (ssh -n, srun --input=none, exec
    mode) the command reads /dev/null and is left to its time limit. The exit status is the
    command's (124: the node-side limit; 143: stopped by the watcher)."""
    limit = ""
    if timeout_s:
        limit = (f"command -v timeout >/dev/null 2>&1 && "
                 f"set -- timeout -k {NODE_KILL_AFTER_S} {max(1, math.ceil(timeout_s))} && g=-; ")
    if not session_stdin:
        return "exec </dev/null; set --; " + limit + f'exec "$@" sh -c {shlex.quote(command)}'
    return ("exec 3<&0 </dev/null; set --; g=; " + limit
            + f'"$@" sh -c {shlex.quote(command)} & p=$!; '
            + '{ IFS= read -r _ <&3; ' + _STOP_COMMAND + '; } >/dev/null 2>&1 & w=$!; '
            + 'exec 3<&-; wait "$p"; r=$?; kill "$w" 2>/dev/null; exit "$r"')


# The watcher's stop. Under `timeout` ($g is "-") the SIGTERM goes to timeout's process group,
# never to timeout alone: timeout forks its command a few microseconds after it starts, and
# coreutils (9.1) ends itself without passing the signal on when one arrives before it has
# recorded its child's PID, leaving the command running with no limit at all (issue 26). The
# group (timeout calls setpgid first thing, the command is forked into it) holds the command from
# its fork on; until timeout has made the group, the signal is retried while timeout lives.
# Without `timeout` ($g is empty) the command itself is signalled, once.
_STOP_COMMAND = ('until kill -s TERM -- "$g$p"; do [ -n "$g" ] && kill -0 "$p" || break; '
                 'sleep 0.01 || sleep 1; done')


def one_line(command: str) -> str:
    """`command` wrapped so that its standard output crosses the wire as one line of at most
    MAX_OUTPUT_BYTES + 1 bytes, exit status kept:
    `sh -c 'out=$(COMMAND); rc=$?; printf %s "$out" | tr -d "\\n" | head -c N; echo; exit $rc'`.

    A verdict is indented JSON (thousands of lines for an 8-GPU node); the fan-out handles
    output line by line, which costs more than the remote run itself on a large sweep. JSON
    strings never hold a raw newline, so dropping them changes no value. Running under `sh -c`
    also makes the command independent of the user's login shell. The cut keeps a node that
    prints without end from filling this process (ClusterShell buffers a line until its end);
    one byte over the limit tells the fan-out that the output was cut."""
    script = (f'out=$({command}); rc=$?; printf "%s" "$out" | tr -d "\\n" | head -c {MAX_OUTPUT_BYTES + 1}; '
              'echo; exit $rc')
    return "sh -c " + shlex.quote(script)


def parse_verdict(text: str) -> tuple[Verdict | None, str]:
    """(verdict, "") when `text` is one gpucheck verdict document of schema 1.x that
    Verdict.from_json reads, else (None, why)."""
    s = text.strip()
    if not s:
        return None, "no output"
    try:
        doc = json.loads(s)
    except RecursionError:
        return None, f"not a verdict: JSON nested too deep ({snippet(s)})"
    except ValueError:
        return None, f"not a verdict: {snippet(s)}"
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA_ID:
        return None, f"not a verdict: {snippet(s)}"
    version = doc.get("schema_version")
    if not supported_version(version):
        return None, f"verdict schema_version {snippet(str(version or '?'))} is not supported (want 1.x)"
    try:
        return Verdict.from_json(doc), ""
    except VerdictError as e:
        return None, f"invalid verdict: {e}"


def failing_results(verdict: Verdict) -> list[ResultEntry]:
    """The results that make a verdict bad: fails first, then errors."""
    return [r for r in verdict.results if r.status is Status.FAIL] + \
        [r for r in verdict.results if r.status is Status.ERROR]


def _label(r: ResultEntry) -> str:
    return f"{r.check}:{r.subject}" if r.subject and r.subject != "node" else r.check


def classify(run: NodeRun, *, timeout_s: float | None = None) -> NodeOutcome:
    """One node's status from what its command did."""

    def outcome(status: str, reason: str, action: str = "investigate", **judged: Any) -> NodeOutcome:
        return NodeOutcome(node=run.node, status=status, reason=reason, action=action, rc=run.rc,
                           duration_s=run.duration_s, stderr_tail=last_line(run.stderr), **judged)

    if run.timed_out:
        limit = f" within {timeout_s:g} s" if timeout_s else ""
        return outcome("timeout", f"no answer{limit} (killed)")
    if run.truncated:
        return outcome("error", f"output larger than {MAX_OUTPUT_BYTES} bytes (cut): not judged")
    verdict, why = parse_verdict(run.stdout)
    if verdict is None:
        err = last_line(run.stderr)
        if run.via == "ssh" and run.rc == 255:
            return outcome("unreachable", err or "ssh failed (exit 255)")
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
        return outcome("error", reason)

    status = verdict.status.value
    if verdict.exit_code == 3 and status != "fail":
        status = "error"  # could not judge (an error result, or a partial run)
    elif verdict.exit_code == 1 and status in GOOD:
        status = "fail"  # --strict turned a warn into unhealthy on the node
    reason = verdict_cause(verdict) if status not in ("pass", "skip") else ""
    from ..render.grid import check_marks

    return outcome(status, reason, verdict.action.value, failing=[_label(r) for r in failing_results(verdict)],
                   verdict=verdict, inputs=fleet_inputs(verdict), checks=check_marks(verdict))


def verdict_cause(verdict: Verdict) -> str:
    """One line naming why a verdict is not a plain pass: its first fail (else error, else
    unexamined skip, else warn) result, or the interruption of a partial run."""
    results = verdict.results
    bad = [r for r in results if r.status is Status.FAIL] or \
          [r for r in results if r.status is Status.ERROR] or \
          [r for r in results if r.unexamined] or \
          [r for r in results if r.status is Status.WARN]
    if not bad:
        if verdict.partial:
            return f"run cut short ({verdict.interrupted})"
        return verdict.status.value
    first = bad[0]
    where = f" {first.subject}" if first.subject and first.subject != "node" else ""
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"{first.check}{where}: {first.summary}{more}"


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

    def commands(self, session_stdin: bool = True) -> dict[str, str]:
        """Each node's shell text (`session_stdin`: see die_with_session)."""
        return {n: one_line(die_with_session(remote_command(self.remote_cmd, self.run_args,
                                                            self.node_args.get(n, ""), self.timeout_s),
                                             self.timeout_s, session_stdin))
                for n in self.nodes}


class VerdictSpool:
    """The nodes' verdicts as compact JSON in an unlinked temporary file (created in `folder`,
    else the temporary folder), with only each one's place kept in memory."""

    def __init__(self, folder: str | None = None):
        self.file = tempfile.TemporaryFile(dir=folder)
        self.where: dict[str, tuple[int, int]] = {}
        self.end = 0
        self.error: str | None = None  # the first write that failed (a full disk): the report is incomplete

    def add(self, node: str, verdict: Verdict) -> None:
        data = json.dumps(verdict.to_json()).encode()
        try:
            self.file.seek(self.end)
            self.file.write(data)
        except OSError as e:
            self.error = self.error or f"cannot keep {node}'s verdict: {e.strerror or e}"
            return
        self.where[node] = (self.end, len(data))
        self.end += len(data)

    def text(self, node: str) -> str | None:
        if node not in self.where:
            return None
        offset, size = self.where[node]
        self.file.seek(offset)
        return self.file.read(size).decode()

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "VerdictSpool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def keep_summary(outcome: NodeOutcome, spool: VerdictSpool | None) -> NodeOutcome:
    """Move the outcome's verdict to the spool (when there is one) and drop it from memory. A
    verdict that cannot be written back as JSON (nested deeper than the encoder goes) makes the
    node an error."""
    verdict, outcome.verdict = outcome.verdict, None
    if verdict is None or spool is None:
        return outcome
    try:
        spool.add(outcome.node, verdict)
    except (RecursionError, ValueError) as e:
        return NodeOutcome(outcome.node, "error", f"verdict cannot be written back as JSON ({type(e).__name__})",
                           action="investigate", rc=outcome.rc, duration_s=outcome.duration_s,
                           stderr_tail=outcome.stderr_tail)
    return outcome


def run_sweep(
    plan: SweepPlan,
    *,
    runner: Callable[..., Mapping[str, NodeRun]],
    on_node: Callable[[NodeOutcome], None] | None = None,
    spool: VerdictSpool | None = None,
    **runner_kw: Any,
) -> tuple[list[NodeOutcome], float]:
    """Fan the command out with `runner` (gpucheck.platform.fanout.run_nodes), classify every node.

    Returns the outcomes in node order and the wall time. Each node's output is released as
    soon as it is classified and its verdict goes to `spool` (when given): the outcomes hold
    summaries only.
    """
    t0 = time.monotonic()
    seen: dict[str, NodeOutcome] = {}

    def judge(run: NodeRun) -> NodeOutcome:
        outcome = keep_summary(classify(run, timeout_s=plan.timeout_s), spool)
        run.stdout = ""  # the NodeRun stays with the runner until it returns: drop its output now
        return outcome

    def done(run: NodeRun) -> None:
        seen[run.node] = outcome = judge(run)
        if on_node is not None:
            on_node(outcome)

    watch = session_stdin(plan.mode, ssh=runner_kw.get("ssh"), srun=runner_kw.get("srun"))
    runs = runner(plan.commands(watch), mode=plan.mode, fanout=plan.fanout, timeout_s=plan.timeout_s,
                  on_done=done, **runner_kw)
    outcomes = [seen.get(n) or judge(runs[n]) for n in plan.nodes]
    return outcomes, time.monotonic() - t0


def apply_fleet(outcomes: list[NodeOutcome], findings: Mapping[str, list[FleetFinding]]) -> None:
    """Merge the fleet comparison's findings into each node's own judgement, once: what the
    grid, the node lines, the summary, the JSON and HTML reports and the exit code all read."""
    for o in outcomes:
        items = list(findings.get(o.node, []))
        if items:
            merge_findings(o, items)


def merge_findings(o: NodeOutcome, items: list[FleetFinding]) -> None:
    """A node that is an outlier among its peers (slow, or bits that differ from the majority)
    is `fail` (its own worse status stays), the checks the findings are about are failing (and
    `fail` in its grid row), its action is the strongest of its own and the findings' (drain
    for corruption), and its reason tells one story: the fleet's first finding, then the node's
    own cause (its own first when the node was bad on its own)."""
    from ..core.result import Action, strongest_action
    from ..render.grid import fold as fold_marks

    own_bad = o.status not in GOOD
    o.fleet = [f.text for f in items]
    o.status = worst([o.status, "fail"])
    o.failing = list(dict.fromkeys([*o.failing, *(f.label for f in items)]))
    marks = dict(o.checks)
    for f in items:
        marks[f.check] = fold_marks([marks.get(f.check, "fail"), "fail"])
    o.checks = tuple(marks.items())
    o.action = strongest_action(Action(a) for a in (o.action, *(f.action for f in items))).value
    story = f"fleet: {items[0].text}" + (f" (+{len(items) - 1} more)" if len(items) > 1 else "")
    o.reason = "; ".join(x for x in ((o.reason, story) if own_bad else (story, o.reason)) if x)


def build_report(
    outcomes: list[NodeOutcome],
    comparison: FleetComparison,
    *,
    plan: SweepPlan,
    started_at: float,
    duration_s: float,
    strict: bool = False,
) -> SweepReport:
    """The sweep report (`--report FILE`) but the verdicts: the nodes' summaries and the fleet
    comparison. report_chunks writes it out with every node's verdict."""
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
        "fleet": comparison.to_json(),
        "nodes": [o.to_dict() for o in outcomes],
    }


def report_chunks(report: SweepReport, spool: VerdictSpool | None) -> Iterator[str]:
    """The report as JSON text, one node at a time: `report` (build_report's) with each node's
    verdict (from the spool; null where there is none) as its entry's last field."""
    head = {k: v for k, v in report.items() if k != "nodes"}
    yield json.dumps(head)[:-1] + ', "nodes": ['
    for i, entry in enumerate(report["nodes"]):
        text = spool.text(entry["node"]) if spool is not None else None
        yield ("" if i == 0 else ", ") + json.dumps(entry)[:-1] + ', "verdict": ' + (text or "null") + "}"
    yield "]}\n"


# -- a whole sweep: run, stop, compare, report ---------------------------------------------------

@dataclass
class SweepRun:
    """The nodes that answered (in node order), the wall time, and the signal that stopped the
    sweep (None: every node answered or timed out)."""

    outcomes: list[NodeOutcome]
    duration_s: float
    interrupted: str | None = None


def sweep_until_stopped(plan: SweepPlan, settings: Mapping[str, Any], *,
                        on_node: Callable[[NodeOutcome], None] | None = None,
                        spool: VerdictSpool | None = None) -> SweepRun:
    """run_sweep with the fan-out (gpucheck.platform.fanout.run_nodes); on a stop
    (processes.Interrupted: SIGTERM/SIGINT) the outcomes of the nodes that answered before it."""
    t0 = time.monotonic()
    answered: dict[str, NodeOutcome] = {}

    def done(outcome: NodeOutcome) -> None:
        answered[outcome.node] = outcome
        if on_node is not None:
            on_node(outcome)

    try:
        outcomes, duration = run_sweep(plan, runner=fanout.run_nodes, on_node=done, spool=spool, **settings)
        return SweepRun(outcomes, duration)
    except Interrupted as e:
        return SweepRun([answered[n] for n in plan.nodes if n in answered], time.monotonic() - t0, e.signame)


def mark_interrupted(report: SweepReport, plan: SweepPlan, outcomes: list[NodeOutcome], signame: str) -> None:
    """A sweep report cut short: it covers only the nodes that answered, names the others, and
    its exit code is 3 (could not judge the node set)."""
    seen = {o.node for o in outcomes}
    report["interrupted"] = signame
    report["unanswered"] = fold(n for n in plan.nodes if n not in seen)
    report["planned"] = len(plan.nodes)
    report["exit_code"] = 3


def sweep_report(plan: SweepPlan, settings: Mapping[str, Any], *, strict: bool,
                 thresholds: Mapping[str, float] | None = None, spool: VerdictSpool | None = None,
                 on_node: Callable[[NodeOutcome], None] | None = None) -> tuple[list[NodeOutcome], SweepReport]:
    """Sweep the plan's nodes, compare them with each other (gpucheck.fleet.compare; thresholds:
    mad_z, rel_floor), and build the report; its `exit_code` is the sweep's (0 healthy, 1 a bad
    node, 3 stopped by a signal)."""
    started = time.time()
    run = sweep_until_stopped(plan, settings, on_node=on_node, spool=spool)
    limits = thresholds or {}
    comparison = compare.compare_inputs({o.node: o.inputs for o in run.outcomes if o.inputs is not None},
                                        mad_z=limits.get("mad_z", compare.MAD_Z),
                                        rel_floor=limits.get("rel_floor", compare.REL_FLOOR))
    apply_fleet(run.outcomes, compare.findings_by_node(comparison))
    report = build_report(run.outcomes, comparison, plan=plan, started_at=started, duration_s=run.duration_s,
                          strict=strict)
    if run.interrupted:
        mark_interrupted(report, plan, run.outcomes, run.interrupted)
    return run.outcomes, report


def spool_folder(report_path: str | None) -> str | None:
    """Where the verdicts wait for the report: next to a report that is (or will be) a regular
    file, so a big fleet does not fill the temporary folder; else (no report, or a FIFO, a
    terminal, /dev/null as the report) the temporary folder."""
    import os
    import stat

    if not report_path:
        return None
    try:
        st = os.stat(report_path)
    except FileNotFoundError:
        return os.path.dirname(os.path.abspath(report_path))
    except OSError:
        return None
    return os.path.dirname(os.path.abspath(report_path)) if stat.S_ISREG(st.st_mode) else None


def write_report(path: str, chunks: Iterable[str]) -> None:
    """Write the report's text chunks to `path` (gpucheck.platform.safeio: a regular file replaced by an
    atomic rename, or written into a FIFO, /dev/null or a terminal; a device or an untrusted
    symlink is refused, never replaced). The report is one line: the indented encoder is ten
    times slower on a big fleet."""
    from ..platform.safeio import write_output

    write_output(path, chunks)


def save_report(report: SweepReport, spool: VerdictSpool | None, report_path: str | None) -> list[str]:
    """Write --report; the warnings to show. The sweep's result (its exit code) never depends on
    the report: one that cannot be written, or verdicts the spool could not keep (a full disk),
    are warnings, and an incomplete report never replaces a good old one."""
    from ..platform.safeio import output_problem

    stands = f"the sweep's result stands (exit {report['exit_code']})"
    if spool is not None and spool.error:
        return [f"{spool.error}: the report lacks those verdicts" + ("; --report not written" if report_path else "")
                + f"; {stands}"]
    if not report_path:
        return []
    try:
        write_report(report_path, report_chunks(report, spool))
    except OSError as e:  # found after the sweep: a loud warning, never a masked result
        return [f"--report {report_path} was not written: {output_problem(e, report_path)}; {stands}"]
    return []
