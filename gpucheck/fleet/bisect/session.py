"""Rounds of group tests: what one test says, the record of every test, and the session that runs
them (disjoint groups at once, up to `parallel`), counts tests and rounds and stops on a test
that could not run.

A group test is a function of a list of nodes returning a GroupOutcome: healthy or not, with a
detail line and metrics. An outcome may say the test could not judge the group at all
(`broken`: the command was not found, it was killed from outside, a GPU it needed was in use):
such an outcome is no evidence about the nodes, so the session records the round and raises
TestBroken; the bisection then blames no node (exit 3).
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, TypedDict

from ...platform.nodeset import fold
from ...platform.processes import check_stop


# A group test's measurements: name -> value (the built-in test: each collective's busbw in GB/s,
# and the reference and floor it was judged against; None where there was none).
Metrics = dict[str, float | None]


@dataclass
class GroupOutcome:
    healthy: bool
    detail: str = ""
    duration_s: float = 0.0
    metrics: Metrics = field(default_factory=dict)
    broken: str | None = None  # the test could not judge this group (no evidence about its nodes)
    timed_out: bool = False  # failed by running past its time limit
    blamed: list[str] = field(default_factory=list)  # nodes the failure names (could not start, hung)
    unreachable: list[str] = field(default_factory=list)  # nodes the launcher could not reach


GroupTest = Callable[[list[str]], GroupOutcome]


class TestBroken(Exception):
    """The group test cannot judge the nodes: it did not run, fails on nodes that passed, or
    never passed on any group. No node is blamed."""

    __test__ = False  # not a pytest class

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class GroupRecord:
    round: int
    phase: str  # search | rows | columns | remainder | verify | confirm | control | pairs | re-pair
    nodes: list[str]
    healthy: bool
    detail: str = ""
    duration_s: float = 0.0
    subject: str | None = None  # confirm: the suspect under test
    metrics: Metrics = field(default_factory=dict)
    concurrency: int = 1  # tests run at once in this round
    timed_out: bool = False
    blamed: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)

    @functools.cached_property
    def label(self) -> str:
        """The group as a folded node set (computed once: folding thousands of names is slow)."""
        return fold(self.nodes)

    def to_dict(self) -> "RecordEntry":
        return {"round": self.round, "phase": self.phase, "nodes": self.label, "size": len(self.nodes),
                "healthy": self.healthy, "detail": self.detail, "duration_s": round(self.duration_s, 3),
                "subject": self.subject, "metrics": self.metrics, "concurrency": self.concurrency,
                "timed_out": self.timed_out, "blamed": list(self.blamed), "unreachable": list(self.unreachable)}


class RecordEntry(TypedDict):
    """A group test as the bisection's document lists it."""

    round: int
    phase: str
    nodes: str  # folded
    size: int
    healthy: bool
    detail: str
    duration_s: float
    subject: str | None
    metrics: Metrics
    concurrency: int
    timed_out: bool
    blamed: list[str]
    unreachable: list[str]


class Session:
    """Runs rounds of group tests, keeps every record, counts tests and rounds. A stop
    (gpucheck.platform.processes) raises Interrupted out of run(); the round it cut short is not kept.
    An outcome marked `broken` raises TestBroken once its round is recorded."""

    def __init__(self, test: GroupTest, *, parallel: int = 0,
                 on_round: Callable[[int, list[GroupRecord]], None] | None = None):
        self.test = test
        self.parallel = parallel  # most tests at once; 0: no limit
        self.on_round = on_round
        self.records: list[GroupRecord] = []
        self.rounds = 0
        self._cache: dict[frozenset[str], bool] = {}

    @property
    def tests(self) -> int:
        return len(self.records)

    @property
    def passed_any(self) -> bool:
        return any(r.healthy for r in self.records)

    def forget(self) -> None:
        """Drop the cached results (after a contradiction showed one of them was wrong)."""
        self._cache.clear()

    def cached(self, group: list[str]) -> bool | None:
        return self._cache.get(frozenset(group))

    def _one(self, nodes: list[str]) -> GroupOutcome:
        t0 = time.monotonic()
        try:
            out = self.test(list(nodes))
        except Exception as e:  # gpucheck's own failure inside the test: no evidence, stop
            out = GroupOutcome(False, f"group test raised {type(e).__name__}: {e}",
                               broken=f"the group test raised {type(e).__name__}: {e}")
        if not out.duration_s:
            out.duration_s = time.monotonic() - t0
        return out

    def _batches(self, groups: list[list[str]], pending: list[int]) -> tuple[list[int], list[int]]:
        """The next round: groups that share no node, at most `parallel` of them."""
        batch: list[int] = []
        used: set[str] = set()
        rest: list[int] = []
        for i in pending:
            g = set(groups[i])
            if g & used or (self.parallel and len(batch) >= self.parallel):
                rest.append(i)
            else:
                batch.append(i)
                used |= g
        return batch, rest

    def run(self, groups: list[list[str]], phase: str, *, subjects: list[str | None] | None = None,
            cache: bool = True, phases: list[str] | None = None,
            judge: Callable[[list[list[str]], list[GroupOutcome]], None] | None = None) -> list[bool]:
        """Test every group; return healthy flags in order. Cached results are reused when
        `cache`; the rest run in as few rounds as node-disjointness and `parallel` allow.
        `phases`: a phase per group (default: `phase` for all). `judge(groups, outcomes)` may
        change the outcomes of a round once all of it is in (the same concurrency for all:
        bandwidth against the round's reference), before anything is recorded."""
        subjects = subjects or [None] * len(groups)
        phases = phases or [phase] * len(groups)
        results: list[bool | None] = [None] * len(groups)
        pending = []
        for i, g in enumerate(groups):
            hit = self._cache.get(frozenset(g)) if cache else None
            if hit is not None:
                results[i] = hit
            else:
                pending.append(i)
        while pending:
            batch, pending = self._batches(groups, pending)
            check_stop()
            with ThreadPoolExecutor(max_workers=max(1, len(batch))) as pool:
                outs = list(pool.map(lambda i: self._one(groups[i]), batch))
            check_stop()  # tests cut short by a stop are no results: the round is dropped
            if judge is not None:
                judge([groups[i] for i in batch], outs)
            self.rounds += 1
            recs = [self._record(groups[i], phases[i], out, subjects[i], len(batch)) for i, out in zip(batch, outs)]
            for i, out in zip(batch, outs):
                results[i] = out.healthy
                if cache:
                    self._cache[frozenset(groups[i])] = out.healthy
            self._announce(recs)
            broken = next((o.broken for o in outs if o.broken), None)
            if broken:
                raise TestBroken(broken)
        return [bool(r) for r in results]

    def _record(self, group: list[str], phase: str, out: GroupOutcome, subject: str | None,
                concurrency: int) -> GroupRecord:
        rec = GroupRecord(self.rounds, phase, list(group), out.healthy, out.detail, out.duration_s, subject,
                          dict(out.metrics), concurrency, out.timed_out, list(out.blamed), list(out.unreachable))
        self.records.append(rec)
        return rec

    def _announce(self, recs: list[GroupRecord]) -> None:
        if self.on_round is None:
            return
        try:
            self.on_round(self.rounds, recs)
        except (OSError, ValueError):  # progress that cannot be printed (a closed pipe) stops nothing
            pass

    def one(self, group: list[str], phase: str, **kw: Any) -> bool:
        return self.run([group], phase, **kw)[0]

    def majority(self, group: list[str], phase: str, repeats: int, *, cache: bool = False) -> bool:
        """Healthy by majority of `repeats` runs (stops as soon as the majority is decided)."""
        if cache and frozenset(group) in self._cache:
            return self._cache[frozenset(group)]
        ok = bad = 0
        need = repeats // 2 + 1
        while ok < need and bad < need:
            if self.one(group, phase, cache=False):
                ok += 1
            else:
                bad += 1
        if ok and bad:  # mixed: a flaky group; decide by the majority of 2 * repeats + 1 runs
            need = repeats + 1
            while ok < need and bad < need:
                if self.one(group, phase, cache=False):
                    ok += 1
                else:
                    bad += 1
        if cache:
            self._cache[frozenset(group)] = ok >= need
        return ok >= need
