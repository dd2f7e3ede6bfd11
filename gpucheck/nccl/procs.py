"""Run ranks in child processes and supervise them: nothing here can hang its caller.

`run_ranks(specs, ...)` starts one spawned child per RankSpec (torch is imported only in the
children), relays the rendezvous port (rank 0 binds a free port and announces it; the other local
ranks, and remote ones through `on_event`, learn it from that announcement or from `port_source`),
forwards progress events, and collects each child's result event. Every child is joined with a
deadline; past it, or when `cancel` is set, the children are killed with SIGKILL and reaped, and
each rank that gave no result gets a synthesized one that says so. Children die with their parent
(PR_SET_PDEATHSIG), so killing `gpucheck nccl run` kills its ranks too.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import threading
import time
from typing import Any, Callable, cast

from ..platform.processes import die_with_parent
from .collective import (CULPRIT_LIMIT_S, NcclEvent, RankReport, RankSpec, base_report, run_rank,
                         timeout_summary)

REAP_S = 5.0


def _child_main(spec_dict: dict[str, Any], conn: Any, parent_pid: int) -> None:  # RankSpec.to_dict()
    die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA indices = NVML indices
    lock = threading.Lock()

    def emit(event: NcclEvent) -> None:
        with lock:
            try:
                conn.send(("event", event))
            except (OSError, EOFError, BrokenPipeError):
                os._exit(1)

    def get_port(timeout_s: float) -> int:
        if not conn.poll(timeout_s):
            raise TimeoutError(f"rendezvous port not announced within {timeout_s:.0f} s")
        kind, value = conn.recv()
        if kind != "port":
            raise RuntimeError(f"unexpected message {kind!r} from the parent")
        return int(value)

    spec = RankSpec(**spec_dict)
    report = run_rank(spec, emit, get_port)
    emit(report)
    try:
        conn.close()
    finally:
        # Skip interpreter teardown: a broken process group's destructors can block.
        os._exit(0 if report.get("status") == "ok" else 1)


def run_ranks(
    specs: list[RankSpec],
    *,
    deadline_s: float,
    on_event: Callable[[NcclEvent], None] | None = None,
    port_source: Callable[[], int | None] | None = None,
    cancel: threading.Event | None = None,
    after_failure_s: float | None = None,
    cancel_reason: str = "cancelled",
) -> list[RankReport]:
    """Run `specs` (ranks of one job, on this host) to completion or to the deadline.

    Ranks whose spec.master_port is None wait for the port: from the local rank 0's announcement,
    else from `port_source()` (polled; returns None until known). Returns one result event per
    spec, in the order of `specs`. Once one rank reports a failure, the others get
    `after_failure_s` (default: the ranks' collective timeout plus the time to name a culprit)
    to report theirs; a rank still silent then (a frozen process) is killed. `cancel` set (at
    any moment, before the start too: then no child starts) kills the children; every rank
    without a result gets an `error` one, failure kind "cancelled", detail `cancel_reason`.
    """
    if after_failure_s is None:
        after_failure_s = max((s.timeout_s for s in specs), default=30.0) + CULPRIT_LIMIT_S + 5.0
    sup = _Supervisor(specs, deadline_s=deadline_s, on_event=on_event, port_source=port_source, cancel=cancel,
                      after_failure_s=after_failure_s, cancel_reason=cancel_reason)
    try:
        sup.start()
        sup.watch()
        sup.synthesize_missing()
    finally:
        sup.reap()
    return [sup.results[s.rank] for s in specs]


class _Supervisor:
    """The children of one run_ranks call: started, relayed the port, watched, reaped."""

    def __init__(self, specs: list[RankSpec], *, deadline_s: float, on_event, port_source, cancel,
                 after_failure_s: float, cancel_reason: str = "cancelled"):
        self.specs = specs
        self.deadline_s = deadline_s
        self.on_event = on_event
        self.port_source = port_source
        self.cancel = cancel
        self.after_failure_s = after_failure_s
        self.cancel_reason = cancel_reason
        self.children: list[tuple[RankSpec, Any, Any]] = []
        self.results: dict[int, RankReport] = {}
        self.port: int | None = None
        self.waiting_for_port: list[Any] = []
        self.t_end = time.monotonic() + deadline_s

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        for spec in self.specs:
            if self._cancelled():  # stopped before (or while) the ranks start: start no more
                return
            parent_conn, child_conn = ctx.Pipe()
            p = ctx.Process(target=_child_main, args=(spec.to_dict(), child_conn, os.getpid()),
                            name=f"gpucheck-rank{spec.rank}", daemon=True)
            p.start()
            child_conn.close()
            self.children.append((spec, p, parent_conn))
            if spec.master_port is None:
                self.waiting_for_port.append(parent_conn)

    def _cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def watch(self) -> None:
        live = {id(c): (s, p, c) for s, p, c in self.children}
        while live and not self._cancelled():
            now = time.monotonic()
            if now >= self.t_end:
                break
            if self.port is None and self.port_source is not None and self.waiting_for_port:
                got = self.port_source()
                if got is not None:
                    self.port = int(got)
                    _send_port(self.waiting_for_port, self.port)
            ready = mpc.wait([c for _, _, c in live.values()], timeout=min(0.2, max(0.0, self.t_end - now)))
            for conn in ready:
                self._receive(live, conn)

    def _receive(self, live: dict[int, tuple[RankSpec, Any, Any]], conn: Any) -> None:
        spec, proc, _ = live[id(conn)]
        try:
            kind, event = conn.recv()
        except (EOFError, OSError):
            live.pop(id(conn))
            proc.join(REAP_S)
            if spec.rank not in self.results:
                self.results[spec.rank] = _no_result(spec, f"rank {spec.rank} process exited "
                                                           f"(code {proc.exitcode}) without a result")
            return
        if kind != "event":
            return
        if event.get("event") == "listening" and self.port is None:
            self.port = int(event["port"])
            _send_port(self.waiting_for_port, self.port)
        if event.get("event") == "result":
            self.results[spec.rank] = cast(RankReport, event)  # a rank's NcclEvent: this one its report
            if event.get("status") != "ok":
                self.t_end = min(self.t_end, time.monotonic() + self.after_failure_s)
        if self.on_event is not None:
            self.on_event(event)

    def synthesize_missing(self) -> None:
        """A result for every rank that sent none: cancelled, or killed as hung."""
        reason = self.cancel_reason if self._cancelled() else None
        failed = [r for r in self.results.values() if r.get("status") != "ok"]
        started = {spec.rank for spec, _proc, _ in self.children}
        for spec in self.specs:
            if spec.rank in self.results:
                continue
            if reason:
                self.results[spec.rank] = _no_result(spec, reason, cancelled=True)
                continue
            if spec.rank not in started:
                why = "not started"
            elif failed:
                why = (f"no result {self.after_failure_s:.0f} s after rank {failed[0]['rank']} reported "
                       f"'{failed[0]['summary']}' (killed)")
            else:
                why = f"no result within {self.deadline_s:.0f} s (killed)"
            self.results[spec.rank] = _no_result(spec, f"rank {spec.rank}: {why}", hang=spec.rank in started)

    def reap(self) -> None:
        for _spec, proc, conn in self.children:
            if proc.is_alive():
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.join(REAP_S)
            conn.close()


def _send_port(conns: list[Any], port: int) -> None:
    for c in conns:
        try:
            c.send(("port", port))
        except (OSError, BrokenPipeError):
            pass
    conns.clear()


def _no_result(spec: RankSpec, why: str, hang: bool = False, cancelled: bool = False) -> RankReport:
    rep = base_report(spec)
    rep["synthesized"] = True  # by the supervisor: the rank itself sent nothing
    if cancelled:
        rep.update({"status": "error", "summary": f"rank {spec.rank}: stopped ({why})",
                    "failure": {"kind": "cancelled", "rank": spec.rank, "host": spec.host, "detail": why}})
    elif hang:
        rep.update({"status": "fail", "summary": timeout_summary(spec.rank, spec.host, "") + f" ({why})",
                    "failure": {"kind": "timeout", "rank": spec.rank, "host": spec.host, "what": "",
                                "detail": why}})
    else:
        rep.update({"status": "error", "summary": why, "failure": {"kind": "exit", "rank": spec.rank,
                                                                   "host": spec.host, "detail": why}})
    return rep
