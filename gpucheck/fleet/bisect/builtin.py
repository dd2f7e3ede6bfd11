"""The built-in group test (`gpucheck bisect --builtin allreduce`): collectives across the group
with every element verified (gpucheck.nccl: all-gather and all-reduce by default), plus the
bitwise check of its nodes; and the pairs that give the bandwidth its reference.

Bandwidth is judged only against a reference measured under the same conditions: before the
search, the nodes are tested in disjoint pairs, all pairs of a round at once (PairScreen), then
the nodes not cleared yet are paired again, with known-good partners where there are, next to
control pairs of good nodes so that the round holds as many pairs as the first. The pairs are
judged as `gpucheck nccl pairs` judges them (gpucheck.nccl.pairs.judge_pairs): the reference of
a collective is the median busbw of the pairs measured as many at once (at least 3), a pair
below `slow_limit` times it is slow, and a node is bad when most of its pairs are slow or fail
and a partner of those is fine elsewhere (or a failure names it, or it is unreachable); those
nodes leave the search. `--min-busbw` is an absolute floor for every measurement (pairs and
groups). The group tests of the search then judge data, hangs, launches and the bitwise check
(and the floor): their bandwidth is never compared with groups of another size or concurrency.
A node whose pairs never had a reference is listed as not judged (exit 3 unless a bad node was
found).

A group test that cannot judge the group (a GPU in use on a host, a rendezvous that never
formed: a setup problem) is `broken`: the bisection stops, no node blamed.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import TYPE_CHECKING, Any

from ...core.verdict import Verdict
from .command import tail
from .session import GroupOutcome, Metrics

if TYPE_CHECKING:  # pragma: no cover
    from ...nccl.report import Outcome

DEFAULT_OPS = ("all_gather", "all_reduce")


PROBE_FANOUT = 64  # bitwise checks started at once (one launcher process each), as a sweep's default fan-out


class BitwiseProbe:
    """The bitwise part of the built-in test: every node runs `gpucheck run --json --check
    repro.bitwise` once (through the collective's launcher); a node whose own verdict fails, or
    whose digests differ from the majority of the nodes probed so far (per fingerprint, with
    gpucheck.repro.majority.fleet_outliers), makes every group it is in unhealthy. A node whose
    check could not judge (its verdict exit 3) makes the group unjudged."""

    def __init__(self, launcher: Any, *, extra_args: list[str] | None = None, timeout_s: float = 600.0):
        self.launcher = launcher
        self.extra_args = list(extra_args or [])
        self.timeout_s = timeout_s
        self.verdicts: dict[str, Verdict | None] = {}
        self.errors: dict[str, str] = {}
        self._lock = threading.Lock()

    def _probe(self, node: str) -> None:
        from ...platform.processes import run
        from ..sweep import parse_verdict

        cmd = [*self.launcher.program, "run", "--json", "--no-history", "--check", "repro.bitwise",
               *self.extra_args]
        try:
            p = run(self.launcher.argv(node, cmd), timeout_s=self.timeout_s)
            if p.timed_out:
                verdict, why = None, f"no verdict within {self.timeout_s:g} s"
            else:
                verdict, why = parse_verdict(p.stdout)
                if verdict is None:
                    why = f"{why} (exit {p.rc}{': ' + tail(p.stderr) if tail(p.stderr) else ''})"
        except OSError as e:
            verdict, why = None, f"cannot start: {e.strerror or e}"
        with self._lock:
            self.verdicts[node] = verdict
            if verdict is None:
                self.errors[node] = why

    def check(self, nodes: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        """({node: why} of the members that fail the bitwise check, {node: why} of those whose
        check could not judge)."""
        from concurrent.futures import ThreadPoolExecutor

        from ..compare import bitwise_comparison
        from ..sweep import verdict_cause

        todo = [n for n in nodes if n not in self.verdicts]
        if todo:
            with ThreadPoolExecutor(max_workers=min(len(todo), PROBE_FANOUT)) as pool:
                list(pool.map(self._probe, todo))
        with self._lock:
            verdicts = {n: v for n, v in self.verdicts.items() if v is not None}
            errors = dict(self.errors)
        bad = {n: f"bitwise check could not run: {errors[n]}" for n in nodes if n in errors}
        unjudged: dict[str, str] = {}
        for n in nodes:
            v = verdicts.get(n)
            if v is not None and v.exit_code == 1:
                bad[n] = f"bitwise check failed on the node: {verdict_cause(v)}"
            elif v is not None and v.exit_code == 3:
                unjudged[n] = f"the bitwise check could not judge {n}: {verdict_cause(v)}"
        fleet = bitwise_comparison(verdicts).by_node
        for n in nodes:
            if n in fleet and n not in bad:
                bad[n] = "; ".join(fleet[n])
        return bad, unjudged


class CollectiveTest:
    """The built-in group test: collectives across the group with data verification (every
    element checked: gpucheck.nccl), plus the bitwise check of its nodes.

    Unhealthy: a collective failed (corruption, a rank that hung or exited, a host that could
    not be reached or could not start gpucheck), a busbw below `min_busbw`, or a member that
    fails the bitwise check. Broken (no evidence): a GPU in use on a host (unless --force), a
    rendezvous that never formed, a bitwise check that could not judge. Metrics: the busbw of
    every collective at the largest size."""

    def __init__(self, launcher: Any, args: list[str], *, deadline_s: float, ops: tuple[str, ...] = DEFAULT_OPS,
                 min_busbw: float | None = None, bitwise: BitwiseProbe | None = None):
        self.launcher = launcher
        self.args = list(args)
        self.deadline_s = deadline_s
        self.ops = tuple(ops)
        self.min_busbw = min_busbw
        self.bitwise = bitwise
        self._index = itertools.count()
        self._lock = threading.Lock()

    def command(self, nodes: list[str]) -> str:
        from ...nccl.launch import describe

        return describe(self.launcher, nodes, self.args)

    def __call__(self, nodes: list[str]) -> GroupOutcome:
        from ...nccl.launch import run_group

        with self._lock:
            index = next(self._index)
        t0 = time.monotonic()
        out = run_group(list(nodes), self.launcher, self.args, deadline_s=self.deadline_s, index=index)
        dt = time.monotonic() - t0
        broken = _cannot_judge(out)
        if broken:
            return GroupOutcome(False, broken, dt, broken=broken)
        try:
            problems, metrics = self._judge(out)
        except _Impossible as e:  # not a measurement: nothing about the nodes is known from it
            why = f"no usable measurement: {e}"
            return GroupOutcome(False, why, dt, broken=why)
        blamed = _blamed(out, nodes)
        if self.bitwise is not None:
            bad, unjudged = self.bitwise.check(list(nodes))
            if unjudged:
                why = "; ".join(unjudged.values())
                return GroupOutcome(False, why, dt, metrics, broken=why)
            problems += [f"{n}: {why}" for n, why in bad.items()]
            blamed += [n for n in bad if n not in blamed]
        if problems:
            return GroupOutcome(False, "; ".join(problems), dt, metrics, blamed=blamed,
                                unreachable=[h for h in out.get("unreachable") or [] if h in nodes])
        return GroupOutcome(True, ", ".join(f"{op} {v:.3g}" for op, v in metrics.items()) + " GB/s busbw", dt,
                            metrics)

    def _judge(self, out: "Outcome") -> tuple[list[str], Metrics]:
        from ...nccl.pairs_run import real_bandwidth
        from ...nccl.report import largest

        problems = [f"{h}: {w}" for h, w in (out.get("launch_errors") or {}).items()]
        if out.get("status") != "ok":
            return [out.get("summary") or out.get("status") or "collective failed", *problems], {}
        metrics: Metrics = {}
        for op in self.ops:
            row = largest(out.get("results") or [], op)
            if row is None:
                problems.append(f"no {op} measurement")
                continue
            busbw = row.get("busbw_gbs")
            if busbw is None or not real_bandwidth(busbw):
                raise _Impossible(f"{op} busbw {busbw!r} is not a finite, non-negative bandwidth")
            metrics[op] = busbw
            if self.min_busbw is not None and busbw < self.min_busbw:
                problems.append(f"slow: {op} busbw {busbw:.3g} GB/s < --min-busbw {self.min_busbw:g}")
        return problems, metrics


class _Impossible(ValueError):
    """A rank reported a bandwidth no measurement gives (NaN, infinite, negative)."""


def _blamed(out: "Outcome", nodes: list[str]) -> list[str]:
    """The hosts a failure names: those that could not take part, or the rank others waited for."""
    launch = [h for h in (out.get("launch_errors") or {}) if h in nodes]
    if launch:
        return launch
    failure = out.get("failure") or {}
    host = failure.get("host")
    if failure.get("kind") in ("timeout", "exit") and host is not None and host in nodes:
        return [host]
    return []


def _cannot_judge(out: "Outcome") -> str | None:
    """Why this group's outcome says nothing about its nodes, or None."""
    failure = out.get("failure") or {}
    kind = failure.get("kind")
    if out.get("status") == "error" and kind == "busy":
        return f"{out.get('summary')} (--force loads GPUs that a job is using)"
    if out.get("status") == "error" and kind == "rendezvous":
        return (f"setup error: {out.get('summary')}; check that the hosts' names resolve to addresses the "
                "others can reach (--addr HOST=ADDR) or name the interface (--ifname)")
    return None


def make_builtin(launcher: Any, *, ops: list[str], sizes: list[int], iters: int, warmup: int, timeout_s: float,
                 backend: str, ifname: str | None, deadline_s: float, slow_limit: float, min_busbw: float | None,
                 bitwise: bool, bitwise_args: list[str], force: bool, repeats: int,
                 flake_rate: float) -> tuple[CollectiveTest, Any]:
    """The built-in group test and its pairs, from the command's settings."""
    from ...nccl.launch import run_args
    from .pairscreen import PairScreen

    args = run_args(ops=list(ops), sizes=sizes, iters=iters, warmup=warmup, timeout_s=timeout_s, backend=backend,
                    ifname=ifname, force=force)
    probe = BitwiseProbe(launcher, extra_args=list(bitwise_args) + (["--force"] if force else []),
                         timeout_s=deadline_s) if bitwise else None
    test = CollectiveTest(launcher, args, deadline_s=deadline_s, ops=tuple(ops), min_busbw=min_busbw, bitwise=probe)
    screen = PairScreen(tuple(ops), slow_limit=slow_limit, min_busbw=min_busbw, repeats=repeats,
                        flake_rate=flake_rate)
    return test, screen
