"""Collect from many nodes: `gpucheck hang --local --json` on each node through the sweep's
fan-out (gpucheck.platform.fanout.run_nodes: ClusterShell over ssh, or srun), and validation of the
`gpucheck.hang.node` documents that come back. A node that answers garbage, no document, or
not at all is a node status with a reason (unreachable, timeout, error), never a crash; the
ranks of the documents that validate become the analysis's input.

SIGTERM/SIGINT while the fan-out runs: the fan-out's ssh/srun children are stopped, the nodes
that answered are kept, the others are `interrupted`.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import signal
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, cast

from ..platform.interrupts import INTERRUPTS
from ..platform.safeio import loads_json
from ..platform.snippets import SNIPPET, last_line, snippet
from .local import NODE_SCHEMA
from .model import NodeDoc, NodeOutline, RankDoc

NODE_STATUSES = ("ok", "partial", "error", "no-processes", "interrupted")
_VERSION = re.compile(r"1\.\d+")
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived (raised in the main thread by the handler of stop_on_signals)."""


@contextlib.contextmanager
def on_signals(handler: Callable[[int], None]) -> Iterator[None]:
    """Call handler(signum) on SIGTERM and SIGINT while the block runs (main thread only)."""
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for s in old:
            signal.signal(s, lambda signum, frame: handler(signum))
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def raise_interrupted(signum: int) -> None:
    raise Interrupted(signal.Signals(signum).name)


# -- validating what a node sends back ------------------------------------------------------------

class Malformed(ValueError):
    pass


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise Malformed(f"{where}: {what}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_frames(frames: Any, where: str) -> None:
    _need(isinstance(frames, list), where, "frames is not a list")
    for k, f in enumerate(frames):
        w = f"{where}.frames[{k}]"
        _need(isinstance(f, dict) and isinstance(f.get("function"), str) and isinstance(f.get("file"), str),
              w, "want function and file strings")
        _need(f.get("line") is None or _is_int(f["line"]), w, "line is not an integer")


def _check_flight(fl: Any, where: str) -> None:
    if fl is None:
        return
    _need(isinstance(fl, dict) and isinstance(fl.get("pgs"), dict), where, "flight has no pgs object")
    for name, pg in fl["pgs"].items():
        w = f"{where}.flight.pgs[{name!r}]"
        _need(isinstance(pg, dict), w, "not an object")
        _need(pg.get("last_seq") is None or _is_int(pg["last_seq"]), w, "last_seq is not an integer")
        _need(isinstance(pg.get("desc", ""), str), w, "desc is not a string")
        ranks = pg.get("ranks")
        _need(ranks is None or (isinstance(ranks, list) and all(_is_int(r) for r in ranks)), w, "bad ranks")
        ops = pg.get("ops", [])
        _need(isinstance(ops, list) and all(isinstance(o, list) and len(o) == 2 and _is_int(o[0])
                                            and isinstance(o[1], str) for o in ops), w, "bad ops")


def _check_process(p: Any, i: int) -> None:
    where = f"processes[{i}]"
    _need(isinstance(p, dict), where, "not an object")
    _need(_is_int(p.get("pid")) and p["pid"] > 0, where, "pid is not a positive integer")
    _need(_is_int(p.get("rank")) and p["rank"] >= 0, where, "rank is not a non-negative integer")
    _need(p.get("status") in ("dumped", "error"), where, "status is not dumped or error")
    _need(p.get("world_size") is None or (_is_int(p["world_size"]) and p["world_size"] > 0), where,
          "world_size is not a positive integer")
    _need(p.get("error") is None or isinstance(p["error"], str), where, "error is not a string")
    threads = p.get("threads")
    _need(isinstance(threads, list), where, "threads is not a list")
    for j, t in enumerate(threads):
        w = f"{where}.threads[{j}]"
        _need(isinstance(t, dict) and isinstance(t.get("main", False), bool), w, "not a thread")
        _check_frames(t.get("frames"), w)
    _need(p["status"] == "error" or threads, where, "dumped without a thread")
    _check_flight(p.get("flight"), where)


def parse_node_doc(text: str) -> tuple[NodeDoc | None, str]:
    """(document, "") when `text` is one valid gpucheck.hang.node document, else (None, why)."""
    s = text.strip()
    if not s:
        return None, "no output"
    try:
        doc = loads_json(s)
    except ValueError:
        return None, f"not a hang document: {snippet(s)}"
    return validate_node_doc(doc)


def validate_node_doc(doc: Any) -> tuple[NodeDoc | None, str]:
    """(document, "") when `doc` (parsed JSON) is a gpucheck.hang.node document whose node,
    status, reason and processes (their pid, rank, status, world size, error, threads and frames,
    flight-recorder summary) are what the analysis reads, else (None, why)."""
    if not isinstance(doc, dict) or doc.get("schema") != NODE_SCHEMA:
        return None, f"not a hang document: {snippet(json.dumps(doc)[:SNIPPET * 2])}"
    version = str(doc.get("schema_version", ""))
    if not _VERSION.fullmatch(version):
        return None, f"hang document schema_version {version or '?'} is not supported (want 1.x)"
    try:
        _need(isinstance(doc.get("node"), str) and bool(NODE_NAME.fullmatch(doc["node"])), "node",
              f"{str(doc.get('node'))[:40]!r} is not a host name")
        _need(doc.get("status") in NODE_STATUSES, "status", f"{str(doc.get('status'))[:40]!r} is not a node status")
        _need(isinstance(doc.get("reason", ""), str), "reason", "not a string")
        _need(isinstance(doc.get("processes"), list), "processes", "not a list")
        for i, p in enumerate(doc["processes"]):
            _check_process(p, i)
    except Malformed as e:
        return None, f"malformed hang document: {e}"
    return cast(NodeDoc, doc), ""  # the checks above hold what the analysis reads


# -- node outcomes --------------------------------------------------------------------------------

@dataclass
class NodeResult:
    node: str
    status: str  # ok partial error no-processes interrupted unreachable timeout
    reason: str = ""
    duration_s: float = 0.0
    ranks: list[RankDoc] = field(default_factory=list)  # the processes, each with its node
    doc: NodeDoc | None = None

    def outline(self) -> NodeOutline:
        return {"node": self.node, "status": self.status, "reason": self.reason, "duration_s": self.duration_s,
                "ranks": sorted(r["rank"] for r in self.ranks),
                "skipped": self.doc.get("skipped_count", 0) if self.doc is not None else 0}


def from_doc(node: str, doc: NodeDoc, duration_s: float = 0.0) -> NodeResult:
    ranks: list[RankDoc] = [{**p, "node": node} for p in doc["processes"]]
    return NodeResult(node=node, status=doc["status"], reason=doc.get("reason", ""), duration_s=duration_s,
                      ranks=ranks, doc=doc)


def classify(run, *, timeout_s: float | None = None) -> NodeResult:
    """One node's result from its fan-out run (gpucheck.platform.fanout.NodeRun)."""
    if run.timed_out:
        limit = f" within {timeout_s:g} s" if timeout_s else ""
        return NodeResult(run.node, "timeout", f"no answer{limit} (killed)", run.duration_s)
    doc, why = parse_node_doc(run.stdout)
    if doc is not None:
        return from_doc(run.node, doc, run.duration_s)
    err = last_line(run.stderr)
    if run.via == "ssh" and run.rc == 255:
        return NodeResult(run.node, "unreachable", err or "ssh failed (exit 255)", run.duration_s)
    if run.rc == 127:
        reason = "gpucheck not installed" + (f" ({err})" if err else "")
    elif run.rc == 2 and not run.stdout.strip():
        reason = "usage error on the node" + (f": {err}" if err else "")
    elif why == "no output":
        reason = f"no hang document (exit {run.rc})" + (f": {err}" if err else "")
    else:
        reason = why
    return NodeResult(run.node, "error", reason, run.duration_s)


# -- the fan-out ------------------------------------------------------------------------------------

@dataclass
class FanoutPlan:
    nodes: list[str]
    local_args: list[str]  # arguments of `hang --local --json` on every node
    remote_cmd: str = "gpucheck"
    mode: str = "ssh"  # ssh | srun
    fanout: int | None = None
    timeout_s: float | None = None

    def command(self, node: str) -> str:
        """The shell text run on `node`: `sh -c '<remote_cmd> hang --local --json ...'`, so that
        the user's login shell (csh, fish) never parses the arguments; remote_cmd is shell text on
        purpose, like sweep's (`env PYTHONPATH=/x python3 -m gpucheck`)."""
        args = ["hang", "--local", "--json", "--node", node, *self.local_args]
        return "sh -c " + shlex.quote(f"{self.remote_cmd.strip()} {shlex.join(args)}")

    def commands(self) -> dict[str, str]:
        return {n: self.command(n) for n in self.nodes}


def collect_nodes(plan: FanoutPlan, *, runner: Callable[..., Mapping[str, Any]],
                  on_node: Callable[[NodeResult], None] | None = None,
                  **runner_kw: Any) -> tuple[list[NodeResult], str | None]:
    """Every node's result, in node order, and the signal that cut the fan-out short (or None)."""
    seen: dict[str, NodeResult] = {}

    def done(run) -> None:
        seen[run.node] = result = classify(run, timeout_s=plan.timeout_s)
        if on_node is not None:
            on_node(result)

    interrupted = None
    runs: Mapping[str, Any] = {}
    try:
        if early := INTERRUPTS.take():  # arrived while the command started and planned
            raise Interrupted(early)
        runs = runner(plan.commands(), mode=plan.mode, fanout=plan.fanout, timeout_s=plan.timeout_s,
                      on_done=done, **runner_kw)
    except (Interrupted, KeyboardInterrupt) as e:
        interrupted = str(e) or "SIGINT"
    results = []
    for n in plan.nodes:
        if n in seen:
            results.append(seen[n])
        elif n in runs:
            results.append(classify(runs[n], timeout_s=plan.timeout_s))
        else:
            results.append(NodeResult(n, "interrupted", f"not collected: {interrupted or 'no result'}"))
    return results, interrupted


def load_recorded(path: str, text: str) -> list[NodeResult]:
    """Node documents saved earlier (`--record`, or `gpucheck hang --local --json` output): one
    document, a list of them, or one per line. ValueError naming the file when one is not valid."""
    s = text.strip()
    if not s:
        raise ValueError(f"{path}: empty: no node document")
    try:
        docs = loads_json(s)
        docs = docs if isinstance(docs, list) else [docs]
    except ValueError:
        try:
            docs = [loads_json(line) for line in s.splitlines() if line.strip()]
        except ValueError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
    if not docs:
        raise ValueError(f"{path}: no node document (an empty list)")
    out = []
    for i, d in enumerate(docs):
        doc, why = validate_node_doc(d)
        if doc is None:
            raise ValueError(f"{path}: document {i + 1}: {why}")
        duration = doc.get("duration_s")
        out.append(from_doc(doc["node"], doc, float(duration) if isinstance(duration, (int, float)) else 0.0))
    return out
