"""One node's collection: find the job's rank processes, dump their stacks, read their flight
recorder dumps; the result is one `gpucheck.hang.node` document (docs/hang.md), which is what
`gpucheck hang --local --json` prints and what the fan-out brings back from every node.

Node statuses: ok (every rank process dumped), partial (some could not be dumped: each says
why), error (none could be: py-spy missing, ptrace forbidden...), no-processes (nothing of the
job here), interrupted (SIGTERM/SIGINT: what was dumped so far is kept). Only ok exits 0.
"""

from __future__ import annotations

import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .. import __version__
from . import flight, procs, pyspy
from .model import NodeDoc, ProcessDoc

NODE_SCHEMA = "gpucheck.hang.node"
NODE_SCHEMA_VERSION = "1.0"
SKIPPED_SHOWN = 50
PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"


@dataclass
class LocalOptions:
    match: str | None = None  # a regular expression on the command line
    job: str | None = None  # a Slurm job id
    node: str | None = None  # this node's name as the collector knows it (default: the hostname)
    dump_timeout_s: float = 10.0
    native: bool = False
    py_spy: str | None = None
    flight: bool = True
    flight_prefix: str | None = None
    parallel: int = 8
    proc_root: str = "/proc"


def ptrace_scope(path: str = PTRACE_SCOPE) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None  # no Yama: ordinary ptrace rules


def node_name(explicit: str | None = None) -> str:
    return explicit or socket.gethostname().split(".")[0]


def _dump_refusal(py_spy: str | None, scope: int | None) -> str | None:
    """Why no process can be dumped here, before trying."""
    if py_spy is None:
        return "py-spy not found (pip install 'gpucheck-cluster[hang]', or --py-spy PATH)"
    if scope == 3:
        return "kernel.yama.ptrace_scope=3: no process may be read, not even by root"
    if scope in (1, 2) and os.geteuid() != 0:
        return f"kernel.yama.ptrace_scope={scope}: reading another process's memory needs root (CAP_SYS_PTRACE)"
    return None


def _proc_state(pid: int, proc_root: str) -> str:
    try:
        with open(f"{proc_root}/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return procs.parse_stat(f.read())[1]
    except (OSError, ValueError, IndexError):
        return "?"


def _dump_one(rank: procs.RankProc, opts: LocalOptions, py_spy: str | None, refusal: str | None,
              children: pyspy.Children) -> ProcessDoc:
    entry: ProcessDoc = {
        "pid": rank.pid, "rank": rank.rank, "rank_from": rank.rank_from, "local_rank": rank.local_rank,
        "world_size": rank.world_size, "group_rank": rank.group_rank, "cmdline": rank.cmdline,
        "status": "error", "error": refusal, "attempts": 0, "duration_s": 0.0, "threads": [],
        "flight": None, "flight_note": None,
    }
    if refusal is None and py_spy is not None:
        got = pyspy.dump_process(py_spy, rank.pid, timeout_s=opts.dump_timeout_s, native=opts.native,
                                 children=children)
        entry["attempts"], entry["duration_s"] = got["attempts"], got["duration_s"]
        if "threads" in got:
            entry["status"], entry["error"] = "dumped", None
            entry["threads"] = [t.to_dict() for t in got["threads"]]
        else:
            error = got.get("error", "not dumped")
            if opts.native and _proc_state(rank.pid, opts.proc_root) in ("T", "t"):
                error += "; the process is left stopped (ptrace): it needs SIGCONT"
            entry["error"] = error
    if opts.flight:
        prefix = flight.prefix_for(rank.environ, opts.flight_prefix)
        entry["flight"], entry["flight_note"] = flight.read_rank(prefix, rank.rank, owner_uid=rank.uid,
                                                                 not_before=rank.start_time)
    return entry


def _status(entries: list[ProcessDoc], interrupted: bool) -> tuple[str, str]:
    failed = [e for e in entries if e["status"] != "dumped"]
    if interrupted:
        return "interrupted", f"interrupted: {len(entries) - len(failed)} of {len(entries)} rank process(es) dumped"
    if not entries:
        return "no-processes", "no rank process of the job on this node"
    if not failed:
        return "ok", ""
    first = failed[0]
    why = f"rank {first['rank']} (pid {first['pid']}): {first['error']}"
    if len(failed) == len(entries):
        return "error", f"no rank process could be dumped: {why}"
    return "partial", f"{len(failed)} of {len(entries)} rank process(es) not dumped: {why}"


def collect_node(opts: LocalOptions, children: pyspy.Children | None = None) -> NodeDoc:
    """This node's `gpucheck.hang.node` document."""
    t0 = time.time()
    children = children or pyspy.Children()
    match = re.compile(opts.match) if opts.match is not None else None
    name = node_name(opts.node)
    py_spy = pyspy.find_py_spy(opts.py_spy)
    version = pyspy.py_spy_version(py_spy) if py_spy else None
    scope = ptrace_scope()
    refusal = _dump_refusal(py_spy, scope)
    infos = procs.scan_procs(opts.proc_root, want_cgroup=opts.job is not None,
                             prefilter=lambda p: procs.may_belong(p, match=match, job=opts.job))
    host = socket.gethostname()
    sel = procs.select_ranks(infos, match=match, job=opts.job, node={name, host, host.split(".")[0]},
                             exclude=procs.own_lineage(proc_root=opts.proc_root))
    workers = max(1, min(opts.parallel, len(sel.ranks)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="py-spy") as pool:
        entries = list(pool.map(lambda r: _dump_one(r, opts, py_spy, refusal, children), sel.ranks))
    status, reason = _status(entries, children.stopped.is_set())
    from ..core.verdict import iso_utc

    return {
        "schema": NODE_SCHEMA,
        "schema_version": NODE_SCHEMA_VERSION,
        "gpucheck_version": __version__,
        "node": name,
        "hostname": socket.gethostname(),
        "time": iso_utc(t0),
        "duration_s": round(time.time() - t0, 3),
        "selector": {"match": opts.match, "job": opts.job, "by": sel.by},
        "py_spy": {"path": py_spy, "version": version,
                   "mode": "native" if opts.native else "nonblocking"},
        "ptrace_scope": scope,
        "status": status,
        "reason": reason,
        "processes": entries,
        "skipped": sel.skipped[:SKIPPED_SHOWN],
        "skipped_count": len(sel.skipped),
        "exit_code": 0 if status == "ok" else 3,
    }
