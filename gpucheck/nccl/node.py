"""One node's part of a collective test (`gpucheck nccl run`): its ranks, their GPUs, the
interface, the events, the exit code.

`run_node(topo, settings, emit=..., note=...)` builds a RankSpec per rank of this invocation,
refuses GPUs a job is using (gpucheck.workers.busy; every rank then reports failure kind "busy"),
picks the network interface when none is given (gpucheck.nccl.topology.pick_interface), runs
the ranks (gpucheck.nccl.procs) and returns 0 verified, 1 fail, 3 could not judge. Events go to
`emit` (one JSON object each); `note` gets the lines meant for stderr.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, cast

from .collective import NcclEvent, RankReport, RankSpec, base_report
from .topology import Topology, pick_interface, rank_hosts, spec_port

EXIT_OK, EXIT_FAIL, EXIT_NO_JUDGEMENT = 0, 1, 3


@dataclass
class NodeSettings:
    ops: list[str]
    sizes: list[int]
    iters: int
    warmup: int
    timeout_s: float
    backend: str
    host_label: str
    deadline_s: float | None = None
    ifname: str | None = None
    peer_hosts: list[str] = field(default_factory=list)
    peer_addrs: list[str] = field(default_factory=list)
    corrupt: dict[str, Any] | None = None  # the --inject corrupt parameters (RankSpec.corrupt)
    force: bool = False


def cuda_likely() -> bool:
    return os.path.exists("/dev/nvidiactl") and os.environ.get("CUDA_VISIBLE_DEVICES", "x") != ""


def uses_gpus(backend: str) -> bool:
    return backend == "nccl" or (backend == "auto" and cuda_likely())


def estimate_deadline(ops: list[str], sizes: list[int], iters: int, warmup: int, timeout_s: float,
                      backend: str) -> float:
    """A hard limit for one run: start-up, two collective timeouts of slack and the sweep at a
    pessimistic rate (never used to judge)."""
    rate = 5e9 if backend == "nccl" else 5e7
    per_op = sum((iters + warmup) * (3.0 * s / rate + 0.01) for s in sizes)
    return 60.0 + 2 * timeout_s + per_op * len(ops)


SESSION_ENDED = "the session that started these ranks ended"


class StdinWatch:
    """Standard input read in the background (the ranks import torch meanwhile).

    `want_port` (`--master-port stdin`): the first line is the rendezvous port. `session`
    (`--session-stdin`): the input is the session of the launcher that started this command
    (an ssh connection, a launcher's pipe), held open and never written past the port line; an
    end-of-file at any moment, before the port line too, means that the session ended (the
    local `nccl pairs` or `bisect` was stopped or killed, the connection dropped) and sets
    `ended`. Without `session` the input is read no further than the port line, as by hand."""

    def __init__(self, *, want_port: bool, session: bool, stream: Any = None):
        self.want_port = want_port
        self.session = session
        self.stream = stream
        self.ended = threading.Event()
        self._port: int | None = None

    def start(self) -> "StdinWatch":
        if self.want_port or self.session:
            threading.Thread(target=self._read, name="gpucheck-stdin", daemon=True).start()
        return self

    def port(self) -> int | None:
        """The port once its line has come, else None."""
        return self._port

    def _read(self) -> None:
        stream = self.stream if self.stream is not None else sys.stdin
        try:
            line = stream.readline(64) if self.want_port else "-"  # bounded: a port is a few digits
            if self.want_port and line:
                try:
                    self._port = int(line.strip())
                except ValueError:
                    pass  # no port: the ranks report that none was announced
            while line and self.session and stream.read(4096):  # bounded reads, whatever comes
                pass
        except (OSError, ValueError):  # an unreadable input ends the session as well
            pass
        if self.session:
            self.ended.set()


def rank_specs(topo: Topology, cfg: NodeSettings, ifname: str | None) -> list[RankSpec]:
    hosts = rank_hosts(topo.world, cfg.peer_hosts)
    return [RankSpec(rank=r, world=topo.world, ops=cfg.ops, sizes=cfg.sizes, local_rank=lr,
                     master_addr=topo.master_addr, master_port=spec_port(r, topo), host=cfg.host_label,
                     peer_hosts=hosts, backend=cfg.backend, iters=cfg.iters, warmup=cfg.warmup,
                     timeout_s=cfg.timeout_s, corrupt=cfg.corrupt, agent_store=topo.agent_store, ifname=ifname)
            for r, lr in zip(topo.ranks, topo.local_ranks)]


def choose_interface(topo: Topology, cfg: NodeSettings) -> tuple[str | None, str | None]:
    """(interface, note): --ifname, else the one that routes to the other hosts."""
    if cfg.ifname:
        return cfg.ifname, None
    if cfg.peer_addrs:
        node_rank = topo.ranks[0] // max(1, topo.world // len(cfg.peer_addrs))
    else:
        node_rank = 0 if 0 in topo.ranks else 1
    name, why = pick_interface(topo.master_addr, cfg.peer_addrs, node_rank)
    return name, (f"network interface {why}" if name else None)


def run_node(topo: Topology, cfg: NodeSettings, *, emit: Callable[[NcclEvent], None],
             note: Callable[[str], None], port_source: Callable[[], int | None] | None = None,
             on_finish: Callable[[list[RankReport], int, str], None] | None = None,
             session_ended: threading.Event | None = None) -> int:
    """Run this invocation's ranks; `emit` gets every event, `on_finish` (a terminal view) the
    reports, the world size and the status at the end. `session_ended` (StdinWatch.ended) stops
    every rank, at any moment: each rank that has not reported gets an `error` result (failure
    kind "cancelled", SESSION_ENDED). The exit code: 0 verified, 1 fail, 3 could not judge."""
    from .procs import run_ranks
    from .report import merge

    ifname, chosen = choose_interface(topo, cfg)
    specs = rank_specs(topo, cfg, ifname)
    notes: list[str] = [chosen] if chosen else []

    def send(ev: NcclEvent) -> None:
        if notes and ev.get("event") == "result":
            rep = cast(RankReport, ev)
            ev = {**rep, "notes": [*rep.get("notes", []), *notes]}
        emit(ev)

    if uses_gpus(cfg.backend) and refuse_busy_gpus(specs, topo.local_ranks, force=cfg.force, emit=send,
                                                   notes=notes, note=note):
        return EXIT_NO_JUDGEMENT
    deadline = cfg.deadline_s or estimate_deadline(cfg.ops, cfg.sizes, cfg.iters, cfg.warmup, cfg.timeout_s,
                                                   cfg.backend)
    reports = run_ranks(specs, deadline_s=deadline, on_event=send, port_source=port_source, cancel=session_ended,
                        cancel_reason=SESSION_ENDED)
    for rep in reports:  # results that no child sent (killed, crashed) are synthesized: print them
        if rep.get("synthesized"):
            send(rep)
    if len(reports) == topo.world:
        status = merge(reports, topo.world)["status"]
    else:
        status = ("ok" if all(r.get("status") == "ok" for r in reports) else
                  "fail" if any(r.get("status") == "fail" for r in reports) else "error")
    if on_finish is not None:
        on_finish(reports, topo.world, status)
    return {"ok": EXIT_OK, "fail": EXIT_FAIL}.get(status, EXIT_NO_JUDGEMENT)


def refuse_busy_gpus(specs: list[RankSpec], local_ranks: list[int], *, force: bool,
                     emit: Callable[[NcclEvent], None], notes: list[str], note: Callable[[str], None]) -> bool:
    """The load-test guard (gpucheck.workers.busy) for this invocation's GPUs: when one is in use (or
    whether it is cannot be read), emit an error result for every rank (failure kind "busy",
    which report.merge turns into a could-not-judge group, blaming no host) and return True.
    With --force, the notes go to stderr and into every result event."""
    from ..workers.busy import guard_ranks

    refusals, forced = guard_ranks(local_ranks, force=force, environ=os.environ)
    for line in forced:
        notes.append(line)
        note(f"gpucheck nccl run: {line}")
    if not refusals:
        return False
    detail = "; ".join(refusals)
    for spec in specs:
        rep = base_report(spec)
        rep.update({"summary": f"not started: {detail}",
                    "failure": {"kind": "busy", "rank": spec.rank, "host": rep["host"], "detail": detail}})
        emit(rep)
    note(f"gpucheck nccl run: not started: {detail}")
    return True
