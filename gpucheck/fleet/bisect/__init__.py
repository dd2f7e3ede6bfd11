"""Find the bad node(s) of a failing job's node list with group tests.

A group test is a function of a set of nodes: healthy or not (a multi-node collective with
data verification, or any command with a `{nodes}` placeholder, e.g. a shortened replay of the
failing job). The pieces:

session     rounds of tests (disjoint groups at once, up to `parallel`), records, TestBroken
search      from failing groups to nodes: quartering (all parts of a round at once) or, with
            parallel 1, generalized binary splitting (fewest tests)
strategies  binary (the whole set, then search) and grid (rows, then columns)
confirm     the rest together must pass; each suspect re-tested with known-good nodes, next to
            a control group of known-good nodes alone
result      suspects, confidence, counts, the JSON document and the exit code
command     a shell command as the group test (`--test`)
builtin     the built-in test (`--builtin allreduce`): collectives with verification, bandwidth
            judged on reference pairs, the bitwise check
plan        what a run would do (`--dry-run`)

A test that cannot judge the nodes (it did not run, fails on known-good nodes, never passes)
ends the bisection with `broken` set and no node blamed (exit 3).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from ...platform.nodeset import fold
from ...platform.processes import Interrupted
from .command import CommandTest
from .confirm import Confirmation
from .plan import plan_text
from .result import BisectResult, BisectSettings, Suspect, posterior_bad
from .search import no_pass_reason
from .session import GroupOutcome, GroupRecord, GroupTest, Session, TestBroken
from .strategies import Found, binary_strategy, grid_layout, grid_strategy

STRATEGIES = ("binary", "grid")
DEFAULT_FLAKE_RATE = 0.05

__all__ = ["STRATEGIES", "BisectResult", "CommandTest", "GroupOutcome", "GroupRecord", "GroupTest", "Suspect",
           "TestBroken", "bisect", "grid_layout", "plan_text", "posterior_bad"]

# A screen runs before the search (the built-in test's bandwidth by pairs): it returns the nodes
# it found bad (with evidence), the nodes it cleared and a document for the result.
Screen = Callable[[Session, list[str]], Any]


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
    screen: Screen | None = None,
    command: str | None = None,
) -> BisectResult:
    """Find the bad nodes of `nodes` (order matters for the grid: it is the job's layout).

    A stop (SIGTERM/SIGINT inside gpucheck.platform.processes.stop_on_signals) ends it at once: the
    result then holds the rounds that completed, no verdict on any node, and `interrupted`.
    A test that cannot judge the nodes ends it with `broken`, no verdict on any node."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (use {', '.join(STRATEGIES)})")
    if len(set(nodes)) != len(nodes) or not nodes:
        raise ValueError("the node list must be non-empty and without duplicates")
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    t0 = time.monotonic()
    session = Session(test, parallel=parallel, on_round=on_round)
    settings = BisectSettings(group_size=group_size, min_group=min_group, max_bad=max_bad, repeats=repeats,
                              flake_rate=flake_rate, parallel=parallel)
    run = _Run(session, nodes, strategy=strategy, settings=settings, confirm_size=confirm_size, screen=screen)
    try:
        result = run.go()
    except Interrupted as e:
        result = run.partial(notes=[f"interrupted by {e.signame} after {session.rounds} complete round(s): "
                                    "no node was judged"])
        result.interrupted = e.signame
    except TestBroken as e:
        result = run.partial(notes=[])
        result.broken = e.reason
    result.command = command
    result.duration_s = time.monotonic() - t0
    return result


# Phases that are not the search: the reference pairs (judged on their own), the confirmation and
# its control groups, the final verification.
NOT_SEARCH_PHASES = frozenset({"pairs", "re-pair", "control", "confirm", "verify"})


class _Run:
    """One bisection: screen, search, confirm; builds the BisectResult."""

    def __init__(self, session: Session, nodes: list[str], *, strategy: str, settings: BisectSettings,
                 confirm_size: int | None, screen: Screen | None):
        self.s = session
        self.nodes = list(nodes)
        self.strategy = strategy
        self.settings = settings
        self.confirm_size = confirm_size
        self.screen = screen
        self.good: list[str] = []
        self.notes: list[str] = []
        self.screened: Any = None
        self.search_counts: tuple[int, int] | None = None  # (tests, rounds) when the search ended

    def partial(self, notes: list[str]) -> BisectResult:
        tests, rounds = self.search_counts or (self.s.tests, self.s.rounds)
        return BisectResult(
            strategy=self.strategy, nodes=self.nodes, bad=[], cleared=[], search_tests=tests, search_rounds=rounds,
            tests=self.s.tests, rounds=self.s.rounds, duration_s=0.0, verified=False, records=self.s.records,
            notes=self.notes + notes, settings=self.settings.copy(),
            bandwidth=getattr(self.screened, "doc", None))

    def go(self) -> BisectResult:
        st = self.settings
        universe = self.nodes
        if self.screen is not None:
            self.screened = self.screen(self.s, self.nodes)
            self.good.extend(n for n in self.screened.good if n not in self.good)
            universe = [n for n in self.nodes if n not in self.screened.bad]
        gsize = st["group_size"] or max(st["min_group"], int(round(math.sqrt(len(universe)))) or 1)
        if len(universe) < max(1, st["min_group"]):
            self.notes.append(f"{len(universe)} node(s) left after the pairs: too few for a group test, "
                              "the rest could not be verified")
            return self._result([], [], verified=not universe, csize=0)
        found = self._search(universe, gsize)
        conf = Confirmation(self.s, universe, self.good, st["repeats"], st["min_group"],
                            self._confirm_size(gsize), st["flake_rate"], self.notes,
                            verified=found.passed_whole)
        self._take_remainder_as_verify(conf, found.suspects)
        suspects = conf.verify(list(found.suspects))
        results = conf.confirm(suspects)
        bad, cleared = conf.judge(suspects, results)
        conf.reverify(bad, cleared)
        self.settings["group_size"] = gsize if self.strategy == "grid" else st["group_size"]
        result = self._result(bad, cleared, verified=conf.verified, csize=conf.csize)
        result.unexplained = self._unexplained(result)
        return result

    def _unexplained(self, result: BisectResult) -> str | None:
        """Why a search that saw failures ends with no bad node (a flaky test or an intermittent
        node: the failure is not explained, so the nodes are not declared healthy), or None."""
        if result.bad or not result.verified:
            return None
        failed = [r for r in self.s.records if not r.healthy and r.phase not in NOT_SEARCH_PHASES]
        if not failed:
            return None
        why = (f"{len(failed)} search test(s) failed (first: {fold(failed[0].nodes)}: {failed[0].detail or 'failed'}), "
               "yet every node passed again: a flaky test or an intermittent node; no node explains the failure "
               "(--repeats N votes on each result)")
        self.notes.append(why)
        return why

    def _result(self, bad: list[Suspect], cleared: list[Suspect], *, verified: bool, csize: int) -> BisectResult:
        bad = self._screened_bad() + bad
        order = {n: i for i, n in enumerate(self.nodes)}
        bad.sort(key=lambda s: order[s.node])
        settings = BisectSettings(**self.settings, confirm_size=csize)
        tests, rounds = self.search_counts or (self.s.tests, self.s.rounds)
        return BisectResult(
            strategy=self.strategy, nodes=self.nodes, bad=bad, cleared=cleared, search_tests=tests,
            search_rounds=rounds, tests=self.s.tests, rounds=self.s.rounds, duration_s=0.0, verified=verified,
            records=self.s.records, notes=self.notes, settings=settings,
            bandwidth=getattr(self.screened, "doc", None))

    def _search(self, universe: list[str], gsize: int) -> Found:
        st = self.settings
        if self.strategy == "grid":
            found = grid_strategy(self.s, universe, group_size=gsize, min_group=st["min_group"],
                                  max_bad=st["max_bad"], good=self.good)
        else:
            found = binary_strategy(self.s, universe, min_group=st["min_group"], max_bad=st["max_bad"],
                                    good=self.good)
        self.notes += found.search.notes
        if found.suspects and not self.s.passed_any:
            raise TestBroken(no_pass_reason(self.s))
        self.search_counts = (self.s.tests, self.s.rounds)
        return found

    def _confirm_size(self, gsize: int) -> int:
        st = self.settings
        size = self.confirm_size or (gsize if self.strategy == "grid" and gsize else 2)
        return max(2, st["min_group"], size)

    def _take_remainder_as_verify(self, conf: Confirmation, suspects: list[str]) -> None:
        """A search that ended with the rest passing together (binary's last test) has done the
        verification: that test counts as the verify step, not as a search test."""
        recs = self.s.records
        if not recs or conf.verified or self.settings["repeats"] > 1:
            return
        last = recs[-1]
        rest = set(conf.nodes) - set(suspects)
        if last.phase == "remainder" and last.healthy and set(last.nodes) == rest:
            last.phase = "verify"
            conf.verified = True
            tests, rounds = self.search_counts or (self.s.tests, self.s.rounds)
            self.search_counts = (tests - 1, rounds - 1 if last.concurrency == 1 else rounds)

    def _screened_bad(self) -> list[Suspect]:
        if self.screened is None:
            return []
        return [Suspect(n, v["failures"], v["runs"], v["confidence"], True, list(v["evidence"]))
                for n, v in self.screened.bad.items()]
