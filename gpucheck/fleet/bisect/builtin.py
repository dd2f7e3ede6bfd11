"""The built-in group test (`gpucheck bisect --builtin allreduce`): collectives across the group
with every element verified (gpucheck.nccl: all-gather and all-reduce by default), plus the
bitwise check of its nodes; and the pairs that give the bandwidth its reference.

Bandwidth is judged only against a reference measured under the same conditions: before the
search, the nodes are tested in disjoint pairs, all pairs of a round at once (PairScreen). The
reference of a collective is the median busbw of the pairs of that round (the best of two when
the round has two pairs): a pair below `slow_limit` times it is slow. Then the nodes of slow
or failed pairs are paired again, each with a node of a good pair, next to control pairs of
good nodes, and judged against that round's own reference. A node slow (or failing) with two
different partners, the second a known-good one, is bad; a node whose second pair is good is
cleared. `--min-busbw` is an absolute floor for every measurement (pairs and groups). The group
tests of the search then judge data, hangs, launches and the bitwise check (and the floor):
their bandwidth is not compared across groups of other sizes and concurrency.

A group test that cannot judge the group (a GPU in use on a host, a rendezvous that never
formed: a setup problem) is `broken`: the bisection stops, no node blamed.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..nodeset import fold
from .command import tail
from .result import posterior_bad
from .session import GroupOutcome, Session, TestBroken

DEFAULT_OPS = ("all_gather", "all_reduce")


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
        self.verdicts: dict[str, dict[str, Any] | None] = {}
        self.errors: dict[str, str] = {}
        self._lock = threading.Lock()

    def _probe(self, node: str) -> None:
        from ...processes import run
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
            with ThreadPoolExecutor(max_workers=len(todo)) as pool:
                list(pool.map(self._probe, todo))
        with self._lock:
            verdicts = {n: v for n, v in self.verdicts.items() if v is not None}
            errors = dict(self.errors)
        bad = {n: f"bitwise check could not run: {errors[n]}" for n in nodes if n in errors}
        unjudged: dict[str, str] = {}
        for n in nodes:
            v = verdicts.get(n)
            if v is not None and v.get("exit_code") == 1:
                bad[n] = f"bitwise check failed on the node: {verdict_cause(v)}"
            elif v is not None and v.get("exit_code") == 3:
                unjudged[n] = f"the bitwise check could not judge {n}: {verdict_cause(v)}"
        fleet = bitwise_comparison(verdicts).get("by_node", {})
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
        problems, metrics = self._judge(out)
        if self.bitwise is not None:
            bad, unjudged = self.bitwise.check(list(nodes))
            if unjudged:
                why = "; ".join(unjudged.values())
                return GroupOutcome(False, why, dt, metrics, broken=why)
            problems += [f"{n}: {why}" for n, why in bad.items()]
        if problems:
            return GroupOutcome(False, "; ".join(problems), dt, metrics)
        return GroupOutcome(True, ", ".join(f"{op} {v:.3g}" for op, v in metrics.items()) + " GB/s busbw", dt,
                            metrics)

    def _judge(self, out: dict[str, Any]) -> tuple[list[str], dict[str, float]]:
        from ...nccl.report import largest

        problems = [f"{h}: {w}" for h, w in (out.get("launch_errors") or {}).items()]
        if out.get("status") != "ok":
            return [out.get("summary") or out.get("status") or "collective failed", *problems], {}
        metrics: dict[str, float] = {}
        for op in self.ops:
            row = largest(out.get("results") or [], op)
            if row is None:
                problems.append(f"no {op} measurement")
                continue
            metrics[op] = row["busbw_gbs"]
            if self.min_busbw is not None and row["busbw_gbs"] < self.min_busbw:
                problems.append(f"slow: {op} busbw {row['busbw_gbs']:.3g} GB/s < --min-busbw {self.min_busbw:g}")
        return problems, metrics


def _cannot_judge(out: dict[str, Any]) -> str | None:
    """Why this group's outcome says nothing about its nodes, or None."""
    failure = out.get("failure") or {}
    kind = failure.get("kind")
    if out.get("status") == "error" and kind == "busy":
        return f"{out.get('summary')} (--force loads GPUs that a job is using)"
    if out.get("status") == "error" and kind == "rendezvous":
        return (f"setup error: {out.get('summary')}; check that the hosts' names resolve to addresses the "
                "others can reach (--addr HOST=ADDR) or name the interface (--ifname)")
    return None


# -- the bandwidth reference: pairs ----------------------------------------------------------------
@dataclass
class Screened:
    """What the pairs found: bad nodes with their evidence, nodes cleared (in a good pair), nodes
    whose bandwidth could not be judged, and the document for the result."""

    bad: dict[str, dict[str, Any]] = field(default_factory=dict)
    good: list[str] = field(default_factory=list)
    doc: dict[str, Any] = field(default_factory=dict)


class PairScreen:
    """Bandwidth (and data) by pairs before the search: see the module's docstring."""

    def __init__(self, ops: tuple[str, ...], *, slow_limit: float, min_busbw: float | None, repeats: int = 1,
                 flake_rate: float = 0.05):
        self.ops = tuple(ops)
        self.flake_rate = flake_rate
        self.slow_limit = slow_limit
        self.min_busbw = min_busbw
        self.repeats = repeats
        self.references: list[dict[str, Any]] = []
        self.verdicts: dict[tuple[str, ...], str] = {}  # pair -> ok | slow | failed | unjudged

    def __call__(self, session: Session, nodes: list[str]) -> Screened:
        pairs = [nodes[i:i + 2] for i in range(0, len(nodes) - 1, 2)]
        left = [nodes[-1]] if len(nodes) % 2 else []
        first = self._round(session, pairs, "pairs")
        good = [n for p, v in zip(pairs, first) if v == "ok" for n in p]
        suspects = [n for p, v in zip(pairs, first) if v in ("slow", "failed") for n in p]
        unjudged = [n for p, v in zip(pairs, first) if v == "unjudged" for n in p] + left
        strikes: dict[str, list[tuple[str, str]]] = {}
        for n, p in ((n, p) for p, v in zip(pairs, first) if v in ("slow", "failed") for n in p):
            strikes.setdefault(n, []).append((fold(p), self._detail(session, p)))
        screened = Screened(good=list(good))
        again = self._repair(session, suspects + unjudged, good, strikes, screened)
        screened.doc = self._doc(nodes, screened, [n for n in nodes if n not in again])
        return screened

    # -- one round of pairs ---------------------------------------------------------------------
    def _round(self, session: Session, pairs: list[list[str]], phase: str,
               phases: list[str] | None = None) -> list[str]:
        if not pairs:
            return []
        ok = session.run(pairs, phase, cache=False, judge=self._judge_round, phases=phases)
        return [self.verdicts.get(tuple(p), "ok" if healthy else "failed") for p, healthy in zip(pairs, ok)]

    def _judge_round(self, groups: list[list[str]], outs: list[GroupOutcome]) -> None:
        """Every pair of a round against that round's reference (same concurrency, same time)."""
        refs = {}
        for op in self.ops:
            vals = sorted(o.metrics[op] for o in outs if o.healthy and op in o.metrics)
            refs[op] = self._reference(op, vals, len(groups))
        for g, o in zip(groups, outs):
            self.verdicts[tuple(g)] = self._verdict(o, refs)

    def _reference(self, op: str, vals: list[float], concurrency: int) -> dict[str, Any]:
        if self.min_busbw is not None:
            ref = {"busbw_gbs": self.min_busbw / self.slow_limit, "how": f"--min-busbw {self.min_busbw:g} GB/s"}
        elif len(vals) >= 3:
            mid = len(vals) // 2
            value = vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2
            ref = {"busbw_gbs": value, "how": f"median of {len(vals)} pairs measured at once"}
        elif len(vals) == 2:
            ref = {"busbw_gbs": vals[-1], "how": "the better of 2 pairs measured at once"}
        else:
            ref = {"busbw_gbs": None, "how": f"none: {len(vals)} good pair(s) in the round (give --min-busbw)"}
        ref.update(op=op, concurrency=concurrency)
        self.references.append(ref)
        return ref

    def _verdict(self, o: GroupOutcome, refs: dict[str, dict[str, Any]]) -> str:
        if not o.healthy:
            return "failed"
        slow = []
        for op, ref in refs.items():
            v = o.metrics.get(op)
            if ref["busbw_gbs"] is None or v is None:
                o.metrics[f"{op}_reference_gbs"] = None
                return "unjudged"
            o.metrics[f"{op}_reference_gbs"] = round(ref["busbw_gbs"], 6)
            if v < self.slow_limit * ref["busbw_gbs"]:
                slow.append(f"{op} busbw {v:.3g} GB/s < {self.slow_limit:g} x {ref['busbw_gbs']:.3g} GB/s "
                            f"({ref['how']})")
        if slow:
            o.healthy = False
            o.detail = "slow: " + "; ".join(slow)
            return "slow"
        return "ok"

    @staticmethod
    def _detail(session: Session, pair: list[str]) -> str:
        rec = next((r for r in reversed(session.records) if r.nodes == pair), None)
        return rec.detail if rec else ""

    # -- the second round: suspects with good partners, next to control pairs -------------------
    def _repair(self, session: Session, todo: list[str], good: list[str],
                strikes: dict[str, list[tuple[str, str]]], screened: Screened) -> list[str]:
        """Pair each node still in question with a good node (different ones on each repeat),
        add control pairs of good nodes so that the round has three pairs, judge. Returns the
        nodes whose bandwidth is still not judged."""
        runs: dict[str, list[tuple[str, str, bool]]] = {n: [] for n in todo}
        for rep in range(self.repeats if todo and good else 0):
            shift = (rep * len(todo)) % len(good)
            partners = good[shift:] + good[:shift]
            pairs = [[n, partners[i]] for i, n in enumerate(todo) if i < len(partners)]
            spare = [g for g in good if g not in {p[1] for p in pairs}]
            controls = [spare[2 * i:2 * i + 2] for i in range(min(max(0, 3 - len(pairs)), len(spare) // 2))]
            verdicts = self._round(session, pairs + controls, "re-pair",
                                   phases=["re-pair"] * len(pairs) + ["control"] * len(controls))
            for c, v in zip(controls, verdicts[len(pairs):]):
                if v == "failed":
                    raise TestBroken(f"the test fails on known-good nodes: control pair {fold(c)}, whose nodes "
                                     f"passed in pairs before, failed: {self._detail(session, c)}")
            for (n, partner), v in zip(pairs, verdicts):
                runs[n].append((partner, self._detail(session, [n, partner]) or v, v in ("slow", "failed")))
        still = []
        for n in todo:
            judged = [r for r in runs[n] if self.verdicts.get((n, r[0])) != "unjudged"]
            if not judged:
                still.append(n)
                continue
            self._conclude(n, judged, strikes.get(n, []), screened)
        return still

    def _conclude(self, n: str, judged: list[tuple[str, str, bool]], first: list[tuple[str, str]],
                  screened: Screened) -> None:
        """Bad when most of its pairs with known-good partners were slow or failed."""
        bad_runs = sum(1 for _, _, bad in judged if bad)
        if bad_runs * 2 > len(judged):
            failures, runs = bad_runs + len(first), len(judged) + len(first)
            evidence = [f"pair {label}: {detail}" for label, detail in first]
            evidence += [f"pair with {p} (known good): {d}" for p, d, bad in judged]
            screened.bad[n] = {"failures": failures, "runs": runs, "evidence": evidence,
                               "confidence": posterior_bad(failures, runs, self.flake_rate)}
        else:
            screened.good.append(n)

    def _doc(self, nodes: list[str], screened: Screened, judged: list[str]) -> dict[str, Any]:
        unjudged = [n for n in nodes if n not in judged]
        return {"ops": list(self.ops), "slow_limit": self.slow_limit, "min_busbw": self.min_busbw,
                "references": list(self.references), "bad": sorted(screened.bad), "unjudged": unjudged,
                "rule": "busbw of each pair against the median of the pairs measured in the same round"
                        if self.min_busbw is None else "busbw of every measurement against --min-busbw"}


def make_builtin(launcher: Any, *, ops: list[str], sizes: list[int], iters: int, warmup: int, timeout_s: float,
                 backend: str, ifname: str | None, deadline_s: float, slow_limit: float, min_busbw: float | None,
                 bitwise: bool, bitwise_args: list[str], force: bool, repeats: int,
                 flake_rate: float) -> tuple[CollectiveTest, PairScreen]:
    """The built-in group test and its pairs, from the command's settings."""
    from ...nccl.launch import run_args

    args = run_args(ops=list(ops), sizes=sizes, iters=iters, warmup=warmup, timeout_s=timeout_s, backend=backend,
                    ifname=ifname, force=force)
    probe = BitwiseProbe(launcher, extra_args=list(bitwise_args) + (["--force"] if force else []),
                         timeout_s=deadline_s) if bitwise else None
    test = CollectiveTest(launcher, args, deadline_s=deadline_s, ops=tuple(ops), min_busbw=min_busbw, bitwise=probe)
    screen = PairScreen(tuple(ops), slow_limit=slow_limit, min_busbw=min_busbw, repeats=repeats,
                        flake_rate=flake_rate)
    return test, screen
