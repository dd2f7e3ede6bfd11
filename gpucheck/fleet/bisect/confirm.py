"""Confirmation: after the search, are the suspects bad and is the rest healthy?

- verify: the nodes not suspected are tested together; they must pass. If they do not, a flaky
  result hid a bad node (or the fault needs several nodes together): the cached results are
  dropped and the search runs again on them, each test a majority vote of `repeats`.
- confirm: each suspect is re-tested `repeats` times with known-good nodes (mixed results: up to
  2 repeats + 1 runs), all suspects of a round at once. Every confirm round also tests a control
  group of known-good nodes alone, of the same size: when the control fails (by majority) the
  test fails on nodes that passed before, so its failures say nothing about the suspects: the
  test is broken (TestBroken), no node is blamed.
- A suspect is bad when most of its re-tests fail; cleared suspects go back with the rest, which
  is then tested together once more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...platform.nodeset import fold
from .result import Suspect, posterior_bad, search_evidence
from .search import Search, pad
from .session import Session, TestBroken

MAX_RESTARTS = 4


@dataclass
class Confirmation:
    session: Session
    nodes: list[str]
    good: list[str]
    repeats: int
    min_group: int
    csize: int  # nodes in a confirm (and control) group
    flake_rate: float
    notes: list[str] = field(default_factory=list)
    verified: bool = False
    control_runs: list[bool] = field(default_factory=list)

    # -- verify ---------------------------------------------------------------------------------
    def verify(self, suspects: list[str]) -> list[str]:
        """Test the rest together until it passes (searching it again when it fails); return the
        suspects, with those the extra searches found."""
        restarts = 0
        while not self.verified:
            sus = set(suspects)
            rest = [n for n in self.nodes if n not in sus]
            if not rest:
                self.notes.append("every node is a suspect: nothing left to verify against")
                return suspects
            if self.session.majority(rest, "verify", self.repeats):
                self._verified(rest)
                return suspects
            if restarts >= MAX_RESTARTS:
                self.notes.append(f"the nodes not suspected still fail after {restarts} extra searches: "
                                  "the fault may need several nodes together, or the test is flaky")
                return suspects
            restarts += 1
            more = self._search_again(rest, restarts)
            suspects += [n for n in more if n not in suspects]
            if not more:
                self.notes.append("the extra search found no single bad node")
                return suspects
        return suspects

    def _verified(self, rest: list[str]) -> None:
        self.verified = True
        rest_set, known = set(rest), set(self.good)
        self.good[:] = [n for n in self.good if n in rest_set] + [n for n in rest if n not in known]

    def _search_again(self, rest: list[str], restarts: int) -> list[str]:
        self.notes.append(f"the nodes not suspected failed together: searching them again (pass {restarts})")
        self.session.forget()  # some earlier result was wrong: test everything afresh
        rest_set = set(rest)
        self.good[:] = [n for n in self.good if n not in rest_set]
        search = Search(self.session, self.nodes, min_group=self.min_group, good=self.good, repeats=self.repeats)
        return search.find([rest], known_bad=True)

    # -- confirm --------------------------------------------------------------------------------
    def confirm(self, suspects: list[str]) -> dict[str, list[bool]]:
        """Re-test every suspect with known-good nodes; a control group alone in every round."""
        results: dict[str, list[bool]] = {s: [] for s in suspects}
        if not suspects:
            return results
        sus = set(suspects)
        pool = [n for n in self.good if n not in sus]
        if not pool:
            self.notes.append("no known-good node to re-test the suspects with: they are re-tested alone")
        for _ in range(self.repeats):
            self._confirm_round(suspects, pool, results)
        # Mixed results: a flaky test; repeat those suspects until 2 * repeats + 1 runs decide.
        for _ in range(self.repeats + 1):
            mixed = [s for s in suspects if len(set(results[s])) > 1 and len(results[s]) < 2 * self.repeats + 1]
            if not mixed or self.repeats == 1:
                break
            self._confirm_round(mixed, pool, results)
        self._judge_control()
        return results

    def _confirm_round(self, todo: list[str], pool: list[str], results: dict[str, list[bool]]) -> None:
        groups: list[list[str]] = []
        used: set[str] = set()
        for s in list(todo):
            g = pad([s], pool, self.csize, avoid=used) if pool else [s]
            if len(g) < self.min_group:  # a collective cannot run on one node
                self.notes.append(f"{s} could not be re-tested: no known-good node to test it with")
                todo = [x for x in todo if x != s]
                continue
            used |= set(g) - {s}
            groups.append(g)
        if not groups:
            return
        subjects: list[str | None] = list(todo)
        phases = ["confirm"] * len(todo)
        control = self._control(pool, used)
        if control:
            groups.append(control)
            subjects.append(None)
            phases.append("control")
        ok = self.session.run(groups, "confirm", subjects=subjects, cache=False, phases=phases)
        for s, healthy in zip(todo, ok):
            results[s].append(healthy)
        if control:
            self.control_runs.append(ok[-1])

    def _control(self, pool: list[str], used: set[str]) -> list[str]:
        """Known-good nodes of the confirm size, none of the pads of this round when possible."""
        if len(pool) < self.csize or self.csize < self.min_group:
            return []
        fresh = [n for n in pool if n not in used]
        return (fresh + [n for n in pool if n in used])[: self.csize]

    def _judge_control(self) -> None:
        runs = self.control_runs
        if runs and sum(1 for ok in runs if not ok) * 2 > len(runs):
            raise TestBroken(f"the test fails on known-good nodes: the control group of {self.csize} nodes that "
                             f"passed before failed {sum(1 for ok in runs if not ok)} of {len(runs)} time(s) "
                             "while the suspects were re-tested")

    # -- verdicts -------------------------------------------------------------------------------
    def judge(self, suspects: list[str], results: dict[str, list[bool]]) -> tuple[list[Suspect], list[Suspect]]:
        bad: list[Suspect] = []
        cleared: list[Suspect] = []
        evidence = search_evidence(self.session.records)
        order = {n: i for i, n in enumerate(self.nodes)}
        for s in sorted(suspects, key=order.__getitem__):
            runs = len(results[s])
            if not runs:  # never re-tested: neither bad nor cleared, and the rest is not explained
                self.verified = False
                continue
            failures = sum(1 for ok in results[s] if not ok)
            sus = Suspect(s, failures, runs, posterior_bad(failures, runs, self.flake_rate), failures * 2 > runs,
                          evidence(s))
            sus.evidence += self._retest_lines(s)
            (bad if sus.confirmed else cleared).append(sus)
        return bad, cleared

    def _retest_lines(self, node: str) -> list[str]:
        controls = {r.round: r for r in self.session.records if r.phase == "control"}
        lines = []
        for r in self.session.records:
            if r.phase != "confirm" or r.subject != node:
                continue
            others = fold([n for n in r.nodes if n != node]) or "nothing"
            result = "passed" if r.healthy else "failed" + (f": {r.detail}" if r.detail else "")
            c = controls.get(r.round)
            control = f" (control {c.label}, no suspect: {'passed' if c.healthy else 'failed'})" if c else ""
            lines.append(f"round {r.round} confirm with {others}: {result}{control}")
        return lines

    def reverify(self, bad: list[Suspect], cleared: list[Suspect]) -> None:
        """The rest passed without the cleared suspects: check that it still does with them."""
        if not (cleared and self.verified):
            return
        confirmed = {b.node for b in bad}
        self.verified = self.session.majority([n for n in self.nodes if n not in confirmed], "verify", self.repeats)
        if not self.verified:
            self.notes.append("the nodes not reported bad fail together once the cleared suspects are back: "
                              "no single bad node explains the failure")
