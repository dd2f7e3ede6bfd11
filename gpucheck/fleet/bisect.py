"""Find the bad node(s) of a failing job's node list with group tests.

A group test is a function of a set of nodes: healthy or not (a multi-node collective with
data verification, or any command with a `{nodes}` placeholder, e.g. a shortened replay of the
failing job). Strategies:

binary  adaptive binary splitting (Hwang's generalized binary splitting): with d bad nodes
        expected among n undecided, test a group of 2^a nodes, a = floor(log2((n-d+1)/d)); a
        healthy group clears all of them, a failing one is halved down to one bad node (a
        tests). The number of bad nodes is not known in advance: the estimate starts at one
        and doubles each time the rest still fails, so k bad nodes among N cost about
        k*log2(N/k) + O(k) tests, one test per round.
grid    two-phase grid (ByteRobust's dual-phase replay): the nodes in rows of `group_size`
        (the job's parallel layout: the nodes one replay needs), every row tested at once;
        then columns: the j-th node of every failing row, padded with nodes of healthy rows
        up to `group_size`, every column at once. One bad node among m x n: two rounds.

Then confirm: the rest of the nodes (all but the suspects) are tested together (they must pass;
if they do not, a flaky test hid a bad node and the search goes on), and every suspect is
re-tested `repeats` times with known-good nodes. How sure: the share of failed re-tests, and
the posterior probability that the node is bad given those re-tests and an assumed flake rate.

Groups tested in one round never share a node (a node runs one test at a time); a round whose
groups overlap, or that holds more groups than `parallel`, runs as several rounds. Results of
the search are cached by node set; confirmation re-tests on purpose.
"""

from __future__ import annotations

import functools
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from ..processes import Interrupted, check_stop

STRATEGIES = ("binary", "grid")
DEFAULT_FLAKE_RATE = 0.05
MAX_RESTARTS = 4


@dataclass
class GroupOutcome:
    healthy: bool
    detail: str = ""
    duration_s: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)


GroupTest = Callable[[list[str]], GroupOutcome]


@dataclass
class GroupRecord:
    round: int
    phase: str  # search | rows | columns | remainder | verify | confirm
    nodes: list[str]
    healthy: bool
    detail: str = ""
    duration_s: float = 0.0
    subject: str | None = None  # confirm: the suspect under test
    metrics: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def label(self) -> str:
        """The group as a folded node set (computed once: folding thousands of names is slow)."""
        from .nodeset import fold

        return fold(self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "phase": self.phase, "nodes": self.label, "size": len(self.nodes),
                "healthy": self.healthy, "detail": self.detail, "duration_s": round(self.duration_s, 3),
                "subject": self.subject, "metrics": self.metrics}


class Session:
    """Runs rounds of group tests, keeps every record, counts tests and rounds. A stop
    (gpucheck.processes) raises Interrupted out of run(); the round it cut short is not kept."""

    def __init__(self, test: GroupTest, *, parallel: int = 0,
                 on_round: Callable[[int, list[GroupRecord]], None] | None = None):
        self.test = test
        self.parallel = parallel
        self.on_round = on_round
        self.records: list[GroupRecord] = []
        self.rounds = 0
        self._cache: dict[frozenset[str], bool] = {}

    @property
    def tests(self) -> int:
        return len(self.records)

    def forget(self) -> None:
        """Drop the cached results (after a contradiction showed one of them was wrong)."""
        self._cache.clear()

    def _one(self, nodes: list[str]) -> GroupOutcome:
        t0 = time.monotonic()
        try:
            out = self.test(list(nodes))
        except Exception as e:  # counts as a failed test; the record names the exception
            out = GroupOutcome(False, f"group test raised {type(e).__name__}: {e}")
        if not out.duration_s:
            out.duration_s = time.monotonic() - t0
        return out

    def run(self, groups: list[list[str]], phase: str, *, subjects: list[str | None] | None = None,
            cache: bool = True) -> list[bool]:
        """Test every group; return healthy flags in order. Cached results are reused when
        `cache`; the rest run in as few rounds as node-disjointness and `parallel` allow."""
        subjects = subjects or [None] * len(groups)
        results: list[bool | None] = [None] * len(groups)
        pending = []
        for i, g in enumerate(groups):
            hit = self._cache.get(frozenset(g)) if cache else None
            if hit is not None:
                results[i] = hit
            else:
                pending.append(i)
        while pending:
            batch, used, rest = [], set(), []
            for i in pending:
                g = set(groups[i])
                if g & used or (self.parallel and len(batch) >= self.parallel):
                    rest.append(i)
                else:
                    batch.append(i)
                    used |= g
            check_stop()
            with ThreadPoolExecutor(max_workers=max(1, len(batch))) as pool:
                outs = list(pool.map(lambda i: self._one(groups[i]), batch))
            check_stop()  # tests cut short by a stop are no results: the round is dropped
            self.rounds += 1
            judge_round = getattr(self.test, "judge_round", None)
            if judge_round is not None:  # e.g. bandwidth judged against the best group so far
                judge_round([groups[i] for i in batch], outs)
            recs = []
            for i, out in zip(batch, outs):
                rec = GroupRecord(self.rounds, phase, list(groups[i]), out.healthy, out.detail, out.duration_s,
                                 subjects[i], dict(out.metrics))
                self.records.append(rec)
                recs.append(rec)
                results[i] = out.healthy
                if cache:
                    self._cache[frozenset(groups[i])] = out.healthy
            if self.on_round is not None:
                try:
                    self.on_round(self.rounds, recs)
                except Exception:
                    pass
            pending = rest
        return [bool(r) for r in results]

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


def _pad(group: list[str], pool: list[str], size: int, avoid: set[str] | None = None) -> list[str]:
    """`group` plus known-good nodes from `pool` up to `size` (nodes in `avoid` used last)."""
    if len(group) >= size:
        return list(group)
    inside = set(group)
    avoid = avoid or set()
    fresh = [p for p in pool if p not in inside and p not in avoid]
    reused = [p for p in pool if p not in inside and p in avoid]
    return list(group) + (fresh + reused)[: size - len(group)]


class _Search:
    """Adaptive binary splitting over an ordered list of undecided nodes.

    Hwang's generalized binary splitting: with d bad nodes expected among the n undecided, test
    a group of 2^a nodes, a = floor(log2((n - d + 1) / d)); a healthy group is cleared, a
    failing one is halved down to one bad node. d is not known: it is estimated from the share
    of bad nodes among the nodes decided so far, and never above the number already found
    (so the estimate of the total at most doubles); with d = 1 the undecided rest is tested
    as a whole first, and a healthy rest ends the search.
    """

    def __init__(self, session: Session, min_group: int, good: list[str], repeats: int = 1,
                 universe: list[str] | None = None):
        self.s = session
        self.min_group = min_group  # smaller groups are padded with known-good nodes
        self.good = good
        self._good_set = set(good)
        self.repeats = repeats  # > 1: every test is a majority vote (after a contradiction)
        self.universe = list(universe or [])  # every node of the bisection
        self.found: set[str] = set()

    def _pool(self, avoid: set[str]) -> list[str]:
        """Known-good nodes to pad with. With none yet, test the nodes outside the failing group
        under search (`avoid`) together: if they pass they are the pool; if they fail too, pad
        with them anyway (the verification and re-tests afterwards catch a wrong conclusion)."""
        if self.good:
            return self.good
        rest = [n for n in self.universe if n not in avoid and n not in self.found]
        if len(rest) >= self.min_group and self.test(rest, "pool"):
            return self.good
        return rest

    def test(self, nodes: list[str], phase: str = "search", avoid: list[str] | None = None) -> bool:
        group = nodes
        if len(nodes) < self.min_group:
            group = _pad(nodes, self._pool(set(avoid or nodes)), self.min_group)
        if self.repeats > 1:
            healthy = self.s.majority(group, phase, self.repeats, cache=True)
        else:
            healthy = self.s.one(group, phase)
        if healthy:
            for n in nodes:
                if n not in self._good_set:
                    self._good_set.add(n)
                    self.good.append(n)
        return healthy

    def find(self, nodes: list[str], *, max_bad: int | None, known_bad: bool) -> list[str]:
        """The bad nodes among `nodes` (`known_bad`: the whole list is known to fail)."""
        u = list(nodes)
        found: list[str] = []
        cleared = 0
        while u:
            n = len(u)
            if max_bad is not None:
                d = max_bad - len(found)
                if d <= 0:
                    break
            elif not found:
                d = 1
            else:
                share = len(found) / (len(found) + cleared)
                d = min(max(1, int(round(share * n))), len(found))
            if d == 1 and not known_bad and max_bad is None:
                if self.test(u, "remainder"):
                    break
                known_bad = True
            if n <= 2 * d - 2:
                for x in u:
                    if self.test([x], avoid=u):
                        cleared += 1
                    else:
                        found.append(x)
                        self.found.add(x)
                break
            a = int(math.floor(math.log2((n - d + 1) / d)))
            g = u[: 2 ** a]
            healthy = False if (len(g) == n and known_bad) else self.test(g, avoid=u)
            if healthy:
                u = u[len(g):]  # if u was known to fail, the rest still is
                cleared += len(g)
                continue
            cand = g
            while len(cand) > 1:
                half = cand[: len(cand) // 2]
                if self.test(half, avoid=cand):
                    gone = set(half)
                    u = [x for x in u if x not in gone]
                    cleared += len(half)
                    cand = cand[len(half):]
                else:
                    cand = half
            found.append(cand[0])
            self.found.add(cand[0])
            u.remove(cand[0])
            known_bad = False
        return found


def binary_strategy(session: Session, nodes: list[str], *, min_group: int, max_bad: int | None,
                    good: list[str]) -> list[str]:
    search = _Search(session, min_group, good, universe=nodes)
    if search.test(nodes):
        return []
    return search.find(nodes, max_bad=max_bad, known_bad=True)


def grid_layout(nodes: list[str], group_size: int) -> list[list[str]]:
    """Rows of `group_size` consecutive nodes; a short last row is merged into the one before
    when it would be smaller than half a row."""
    rows = [nodes[i:i + group_size] for i in range(0, len(nodes), group_size)]
    if len(rows) > 1 and len(rows[-1]) < max(1, group_size // 2):
        rows[-2].extend(rows.pop())
    return rows


def grid_strategy(session: Session, nodes: list[str], *, group_size: int, min_group: int,
                  max_bad: int | None, good: list[str]) -> list[str]:
    rows = grid_layout(nodes, group_size)
    healthy = session.run(rows, "rows")
    bad_rows = [r for r, ok in zip(rows, healthy) if not ok]
    for r, ok in zip(rows, healthy):
        if ok:
            good.extend(r)
    if not bad_rows:
        return []
    if len(bad_rows) == 1 and not good:
        return _Search(session, min_group, good, universe=nodes).find(bad_rows[0], max_bad=max_bad, known_bad=True)
    # Columns: the j-th node of every row (the nodes of passing rows are known good); only the
    # columns that cross a failing row need a test. Each column is its own set of nodes, so all of
    # them run in one round.
    width = max(len(r) for r in rows)
    bad_members = {n for r in bad_rows for n in r}
    columns = [[r[j] for r in rows if j < len(r)] for j in range(width)]
    pieces = [c for c in columns if bad_members.intersection(c)]
    groups, used = [], set()
    for p in pieces:
        g = _pad(p, good, min_group, avoid=used)
        used |= set(g) - set(p)
        groups.append(g)
    col_ok = session.run(groups, "columns")
    suspects: list[str] = []
    ambiguous: list[list[str]] = []
    for piece, ok in zip(pieces, col_ok):
        crossing = [n for n in piece if n in bad_members]
        if ok:
            good.extend(n for n in crossing if n not in good)
        elif len(crossing) == 1:
            suspects.append(crossing[0])  # the crossing of a failing row and a failing column
        else:
            ambiguous.append(crossing)  # several failing rows cross here
    # Groups in the searches below keep the replay's size, padded with known-good nodes.
    search = _Search(session, max(min_group, group_size if good else min_group), good, universe=nodes)
    for piece in ambiguous:
        suspects += search.find(piece, max_bad=None, known_bad=True)
    if not suspects and not ambiguous:
        # Every column passed although rows failed: a flaky row, or a fault that needs the whole
        # row; search the failing rows one by one.
        for r in bad_rows:
            suspects += search.find(r, max_bad=max_bad, known_bad=False)
    return suspects


def posterior_bad(failures: int, runs: int, flake_rate: float) -> float:
    """P(node bad | `failures` of `runs` re-tests failed), prior 1/2, each test wrong with
    probability `flake_rate`."""
    e = min(max(flake_rate, 1e-9), 0.5 - 1e-9)
    passes = runs - failures
    log_bad = failures * math.log(1 - e) + passes * math.log(e)
    log_good = failures * math.log(e) + passes * math.log(1 - e)
    return 1.0 / (1.0 + math.exp(log_good - log_bad))


@dataclass
class Suspect:
    node: str
    failures: int = 0
    runs: int = 0
    confidence: float = 0.0
    confirmed: bool = False
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "confirmed": self.confirmed, "failures": self.failures, "runs": self.runs,
                "confidence": round(self.confidence, 6), "evidence": list(self.evidence)}


@dataclass
class BisectResult:
    strategy: str
    nodes: list[str]
    bad: list[Suspect]
    cleared: list[Suspect]
    search_tests: int
    search_rounds: int
    tests: int
    rounds: int
    duration_s: float
    verified: bool  # the nodes not reported bad passed together
    records: list[GroupRecord]
    notes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    interrupted: str | None = None  # the signal that stopped it (a partial result)

    @property
    def bad_nodes(self) -> list[str]:
        return [s.node for s in self.bad]

    def to_dict(self) -> dict[str, Any]:
        from .nodeset import fold

        return {
            "schema": "gpucheck.bisect", "schema_version": "1.0",
            "strategy": self.strategy, "nodeset": fold(self.nodes), "nodes": len(self.nodes),
            "bad": fold(self.bad_nodes), "bad_nodes": [s.to_dict() for s in self.bad],
            "cleared": [s.to_dict() for s in self.cleared],
            "verified": self.verified,
            "tests": self.tests, "rounds": self.rounds,
            "search_tests": self.search_tests, "search_rounds": self.search_rounds,
            "confirm_tests": self.tests - self.search_tests, "confirm_rounds": self.rounds - self.search_rounds,
            "duration_s": round(self.duration_s, 3), "settings": self.settings, "notes": list(self.notes),
            "records": [r.to_dict() for r in self.records],
            "interrupted": self.interrupted,
            # 3: no single bad node explains why the nodes fail together, or it was interrupted
            "exit_code": 3 if self.interrupted else 1 if self.bad else (0 if self.verified else 3),
        }


def _evidence(records: list[GroupRecord]) -> Callable[[str], list[str]]:
    """node -> the failed search tests that contained it, one line each."""
    failed = [(r, set(r.nodes)) for r in records if not r.healthy and r.phase != "confirm"]

    def lines(node: str) -> list[str]:
        return [f"round {r.round} {r.phase} {r.label} failed" + (f": {r.detail}" if r.detail else "")
                for r, members in failed if node in members]

    return lines


def bisect(
    nodes: list[str],
    test: GroupTest,
    *,
    strategy: str = "binary",
    group_size: int | None = None,
    min_group: int = 1,
    max_bad: int | None = None,
    repeats: int = 1,
    confirm_size: int | None = None,
    flake_rate: float = DEFAULT_FLAKE_RATE,
    parallel: int = 0,
    on_round: Callable[[int, list[GroupRecord]], None] | None = None,
) -> BisectResult:
    """Find the bad nodes of `nodes` (order matters for the grid: it is the job's layout).

    A stop (SIGTERM/SIGINT inside gpucheck.processes.stop_on_signals) ends it at once: the
    result then holds the rounds that completed, no verdict on any node, and `interrupted`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (use {', '.join(STRATEGIES)})")
    if len(set(nodes)) != len(nodes) or not nodes:
        raise ValueError("the node list must be non-empty and without duplicates")
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    t0 = time.monotonic()
    session = Session(test, parallel=parallel, on_round=on_round)
    try:
        return _bisect(session, nodes, t0=t0, strategy=strategy, group_size=group_size, min_group=min_group,
                       max_bad=max_bad, repeats=repeats, confirm_size=confirm_size, flake_rate=flake_rate,
                       parallel=parallel)
    except Interrupted as e:
        return BisectResult(
            strategy=strategy, nodes=list(nodes), bad=[], cleared=[], search_tests=session.tests,
            search_rounds=session.rounds, tests=session.tests, rounds=session.rounds,
            duration_s=time.monotonic() - t0, verified=False, records=session.records, interrupted=e.signame,
            notes=[f"interrupted by {e.signame} after {session.rounds} complete round(s): no node was judged"],
            settings={"group_size": group_size, "min_group": min_group, "max_bad": max_bad, "repeats": repeats,
                      "flake_rate": flake_rate, "parallel": parallel},
        )


def _bisect(session: Session, nodes: list[str], *, t0: float, strategy: str, group_size: int | None,
            min_group: int, max_bad: int | None, repeats: int, confirm_size: int | None, flake_rate: float,
            parallel: int) -> BisectResult:
    good: list[str] = []
    gsize = group_size or max(min_group, int(round(math.sqrt(len(nodes)))) or 1)
    notes: list[str] = []

    if strategy == "grid":
        suspects = grid_strategy(session, nodes, group_size=gsize, min_group=min_group, max_bad=max_bad, good=good)
    else:
        suspects = binary_strategy(session, nodes, min_group=min_group, max_bad=max_bad, good=good)
    search_tests, search_rounds = session.tests, session.rounds

    # Confirm. The rest must pass together; if it does not, a flaky result hid a bad node.
    # binary with no suspect: the whole set just passed, and with one run there is nothing to repeat.
    verified = not suspects and strategy == "binary"
    restarts = 0
    while not (verified and repeats == 1):
        sus = set(suspects)
        rest = [n for n in nodes if n not in sus]
        if not rest:
            notes.append("every node is a suspect: nothing left to verify against")
            break
        if session.majority(rest, "verify", repeats):
            verified = True
            rest_set, known = set(rest), set(good)
            good[:] = [n for n in good if n in rest_set] + [n for n in rest if n not in known]
            break
        if restarts >= MAX_RESTARTS:
            notes.append(f"the nodes not suspected still fail after {restarts} extra searches: "
                         "the fault may need several nodes together, or the test is flaky")
            break
        restarts += 1
        notes.append(f"the nodes not suspected failed together: searching them again (pass {restarts})")
        session.forget()  # some earlier result was wrong: test everything afresh
        rest_set = set(rest)
        good[:] = [n for n in good if n not in rest_set]
        more = _Search(session, min_group, good, repeats, universe=nodes).find(rest, max_bad=None, known_bad=True)
        suspects += [n for n in more if n not in suspects]
        if not more:
            notes.append("the extra search found no single bad node")
            break

    csize = max(2, min_group, confirm_size or (group_size if strategy == "grid" and group_size else 2))
    results: dict[str, list[bool]] = {s: [] for s in suspects}
    sus = set(suspects)
    pool = [n for n in good if n not in sus]
    if suspects and not pool:
        notes.append("no known-good node to re-test the suspects with: they are re-tested alone")
    def confirm_round(todo: list[str]) -> None:
        groups, used = [], set()
        for s in todo:
            g = _pad([s], pool, csize, avoid=used) if pool else [s]
            used |= set(g) - {s}
            groups.append(g)
        for s, ok in zip(todo, session.run(groups, "confirm", subjects=list(todo), cache=False)):
            results[s].append(ok)

    for _ in range(repeats):
        confirm_round(suspects)
    # Mixed results: a flaky test; repeat those suspects until 2 * repeats + 1 runs decide.
    for _ in range(repeats + 1):
        mixed = [s for s in suspects if len(set(results[s])) > 1 and len(results[s]) < 2 * repeats + 1]
        if not mixed or repeats == 1:
            break
        confirm_round(mixed)

    from .nodeset import fold

    bad, cleared = [], []
    evidence = _evidence(session.records)
    order = {n: i for i, n in enumerate(nodes)}
    suspects.sort(key=order.__getitem__)
    for s in suspects:
        runs = len(results[s])
        failures = sum(1 for ok in results[s] if not ok)
        sus = Suspect(s, failures, runs, posterior_bad(failures, runs, flake_rate), failures * 2 > runs,
                      evidence(s))
        for r in session.records:
            if r.phase == "confirm" and r.subject == s:
                others = fold([n for n in r.nodes if n != s]) or "nothing"
                result = "passed" if r.healthy else "failed" + (f": {r.detail}" if r.detail else "")
                sus.evidence.append(f"round {r.round} confirm with {others}: {result}")
        (bad if sus.confirmed else cleared).append(sus)
    if cleared and verified:
        # The rest passed without the cleared suspects: check that it still does with them.
        confirmed = {b.node for b in bad}
        verified = session.majority([n for n in nodes if n not in confirmed], "verify", repeats)
        if not verified:
            notes.append("the nodes not reported bad fail together once the cleared suspects are back: "
                         "no single bad node explains the failure")
    return BisectResult(
        strategy=strategy, nodes=list(nodes), bad=bad, cleared=cleared,
        search_tests=search_tests, search_rounds=search_rounds, tests=session.tests, rounds=session.rounds,
        duration_s=time.monotonic() - t0, verified=verified, records=session.records, notes=notes,
        settings={"group_size": gsize if strategy == "grid" else group_size, "min_group": min_group,
                  "max_bad": max_bad, "repeats": repeats, "confirm_size": csize, "flake_rate": flake_rate,
                  "parallel": parallel},
    )


def plan_text(nodes: list[str], *, strategy: str, group_size: int | None, min_group: int,
              repeats: int, max_bad: int | None) -> list[str]:
    """What `bisect` would do (for --dry-run), without running a test."""
    from .nodeset import fold

    n = len(nodes)
    lines = [f"{n} node(s): {fold(nodes)}; strategy {strategy}"]
    if strategy == "grid":
        g = group_size or max(min_group, int(round(math.sqrt(n))) or 1)
        rows = grid_layout(nodes, g)
        lines.append(f"round 1: {len(rows)} row group(s) of about {g} node(s), all at once:")
        lines += [f"  row {i + 1}: {fold(r)}" for i, r in enumerate(rows)]
        lines.append(f"round 2: up to {max(len(r) for r in rows)} column group(s) of {len(rows)} node(s), all at "
                     "once: the j-th node of every row (only columns that cross a failing row)")
        lines.append(f"one bad node: {len(rows)} + {max(len(r) for r in rows)} tests in 2 rounds")
    else:
        k = max_bad or 1
        est = k * math.log2(max(n / k, 1)) + 2 * k + 1
        lines.append("test the whole set, then split (Hwang's generalized binary splitting), one test a round")
        lines.append(f"about {est:.0f} tests for {k} bad node(s) (k*log2(N/k) + 2k + 1)")
    lines.append(f"confirm: the other nodes together, and each suspect {repeats} time(s) with known-good nodes")
    return lines


# -- group tests --------------------------------------------------------------------------------

def _tail(text: str, n: int = 200) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:n] if lines else ""


class CommandTest:
    """A user command as the group test: healthy when it exits 0.

    Placeholders: {nodes} (the group as a folded node set, e.g. n[1-4,7]), {nodes_comma}
    (n1,n2,...), {count}. Each is substituted shell-quoted, in one pass; a template that puts
    one inside a quoted string or after a backslash is refused (quoting cannot protect it there:
    gpucheck.fleet.placeholders). The command runs with /bin/sh in a process group of its own;
    past `timeout_s` the whole group is stopped (SIGTERM, SIGKILL a second
    later) and the test counts as failed (a hang is what bad nodes often do).
    """

    PLACEHOLDERS = ("{nodes}", "{nodes_comma}")
    ALL = ("{nodes}", "{nodes_comma}", "{count}")

    def __init__(self, template: str, *, timeout_s: float | None = None, shell: str = "/bin/sh"):
        from .placeholders import quoted_placeholder, refusal

        if not any(p in template for p in self.PLACEHOLDERS):
            raise ValueError(f"--test {template!r} has no {{nodes}} (or {{nodes_comma}}) placeholder")
        hit = quoted_placeholder(template, self.ALL)
        if hit:
            raise ValueError(refusal("--test", template, hit))
        self.template = template
        self.timeout_s = timeout_s
        self.shell = shell

    def command(self, nodes: list[str]) -> str:
        from .nodeset import fold
        from .placeholders import substitute

        return substitute(self.template, {"{nodes_comma}": ",".join(nodes), "{nodes}": fold(nodes),
                                          "{count}": str(len(nodes))})

    def __call__(self, nodes: list[str]) -> GroupOutcome:
        from ..processes import run

        cmd = self.command(nodes)
        t0 = time.monotonic()
        try:
            done = run([self.shell, "-c", cmd], timeout_s=self.timeout_s)
        except OSError as e:
            return GroupOutcome(False, f"cannot start {self.shell}: {e.strerror or e}")
        dt = time.monotonic() - t0
        if done.timed_out:
            return GroupOutcome(False, f"timed out after {self.timeout_s:g} s (killed)", dt)
        if done.rc == 0:
            return GroupOutcome(True, "exit 0", dt)
        why = _tail(done.stderr) or _tail(done.stdout)
        return GroupOutcome(False, f"exit {done.rc}" + (f": {why}" if why else ""), dt)


class BitwiseProbe:
    """The bitwise part of the built-in test: every node runs `gpucheck run --json --check
    repro.bitwise` once (through the collective's launcher); a node whose own verdict fails, or
    whose digests differ from the majority of the nodes probed so far (per fingerprint, with
    gpucheck.repro.majority.fleet_outliers), makes every group it is in unhealthy."""

    def __init__(self, launcher: Any, *, extra_args: list[str] | None = None, timeout_s: float = 600.0):
        import threading

        self.launcher = launcher
        self.extra_args = list(extra_args or [])
        self.timeout_s = timeout_s
        self.verdicts: dict[str, dict[str, Any] | None] = {}
        self.errors: dict[str, str] = {}
        self._lock = threading.Lock()

    def _probe(self, node: str) -> None:
        from ..processes import run
        from .sweep import parse_verdict

        cmd = [*self.launcher.program, "run", "--json", "--no-history", "--check", "repro.bitwise",
               *self.extra_args]
        try:
            p = run(self.launcher.argv(node, cmd), timeout_s=self.timeout_s)
            if p.timed_out:
                verdict, why = None, f"no verdict within {self.timeout_s:g} s"
            else:
                verdict, why = parse_verdict(p.stdout)
                if verdict is None:
                    why = f"{why} (exit {p.rc}{': ' + _tail(p.stderr) if _tail(p.stderr) else ''})"
        except OSError as e:
            verdict, why = None, f"cannot start: {e.strerror or e}"
        with self._lock:
            self.verdicts[node] = verdict
            if verdict is None:
                self.errors[node] = why

    def bad(self, nodes: list[str]) -> dict[str, str]:
        """{node: why} for the members of `nodes` that fail the bitwise check."""
        from concurrent.futures import ThreadPoolExecutor

        from .compare import bitwise_comparison

        todo = [n for n in nodes if n not in self.verdicts]
        if todo:
            with ThreadPoolExecutor(max_workers=len(todo)) as pool:
                list(pool.map(self._probe, todo))
        with self._lock:
            verdicts = {n: v for n, v in self.verdicts.items() if v is not None}
            errors = dict(self.errors)
        out = {n: f"bitwise check could not run: {errors[n]}" for n in nodes if n in errors}
        for n in nodes:
            v = verdicts.get(n)
            if v is not None and v.get("exit_code") == 1:
                from .sweep import verdict_cause

                out[n] = f"bitwise check failed on the node: {verdict_cause(v)}"
        fleet = bitwise_comparison(verdicts).get("by_node", {})
        for n in nodes:
            if n in fleet and n not in out:
                out[n] = "; ".join(fleet[n])
        return out


class AllReduceTest:
    """The built-in group test: an all-reduce across the group with data verification (every
    element checked: gpucheck.nccl), plus the bitwise check of its nodes.

    Unhealthy: the collective failed (corruption, a rank that hung or exited, a host that could
    not start), its bus bandwidth is below `slow_limit` times the best group's seen so far (the
    best of the same round included: judged once the round is complete) or below `min_busbw`,
    or a member fails the bitwise check.
    """

    def __init__(self, launcher: Any, args: list[str], *, deadline_s: float, op: str = "all_reduce",
                 slow_limit: float = 0.5, min_busbw: float | None = None, bitwise: BitwiseProbe | None = None):
        import itertools
        import threading

        self.launcher = launcher
        self.args = list(args)
        self.deadline_s = deadline_s
        self.op = op
        self.slow_limit = slow_limit
        self.min_busbw = min_busbw
        self.bitwise = bitwise
        self.best: float | None = None
        self._index = itertools.count()
        self._lock = threading.Lock()

    def __call__(self, nodes: list[str]) -> GroupOutcome:
        from ..nccl.launch import run_group
        from ..nccl.report import largest

        with self._lock:
            index = next(self._index)
        t0 = time.monotonic()
        out = run_group(list(nodes), self.launcher, self.args, deadline_s=self.deadline_s, index=index)
        dt = time.monotonic() - t0
        errors = out.get("launch_errors") or {}
        problems = []
        if out.get("status") != "ok":
            problems.append(out.get("summary") or out.get("status") or "collective failed")
        problems += [f"{h}: {w}" for h, w in errors.items()]
        metrics: dict[str, Any] = {}
        row = largest(out.get("results") or [], self.op) if out.get("status") == "ok" else None
        if out.get("status") == "ok" and row is None:
            problems.append(f"no {self.op} measurement")
        if row is not None:
            metrics = {"busbw_gbs": row["busbw_gbs"], "algbw_gbs": row["algbw_gbs"], "bytes": row["bytes"]}
            if self.min_busbw is not None and row["busbw_gbs"] < self.min_busbw:
                problems.append(f"slow: busbw {row['busbw_gbs']:.3g} GB/s < --min-busbw {self.min_busbw:g}")
        if self.bitwise is not None:
            problems += [f"{n}: {why}" for n, why in self.bitwise.bad(list(nodes)).items()]
        if problems:
            return GroupOutcome(False, "; ".join(problems), dt, metrics)
        return GroupOutcome(True, f"busbw {metrics['busbw_gbs']:.3g} GB/s", dt, metrics)

    def judge_round(self, groups: list[list[str]], outcomes: list[GroupOutcome]) -> None:
        """Bandwidth against the best group so far, this round's included."""
        measured = [o.metrics["busbw_gbs"] for o in outcomes if o.metrics.get("busbw_gbs")]
        with self._lock:
            if measured:
                self.best = max([*measured, *([self.best] if self.best else [])])
            best = self.best
        if not best:
            return
        limit = self.slow_limit * best
        for o in outcomes:
            bw = o.metrics.get("busbw_gbs")
            if o.healthy and bw is not None and bw < limit:
                o.healthy = False
                o.detail = (f"slow: busbw {bw:.3g} GB/s < {self.slow_limit:g} x the best group's "
                            f"{best:.3g} GB/s")
            if bw is not None:
                o.metrics["best_busbw_gbs"] = best
