"""What a bisection found: suspects with their evidence and confidence, the counts, the exit code.

Exit code: 1 when bad nodes were found and the nodes not reported bad pass together; 0 when the
whole set passes; 3 otherwise: the test is broken (it did not run, fails on known-good nodes,
never passed), no single bad node explains the failure (the rest still fails), some node's
bandwidth could not be judged, or a signal stopped the run. Only 1 names nodes to drain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, TypedDict

from ...platform.nodeset import fold
from .session import GroupRecord, RecordEntry

SCHEMA = "gpucheck.bisect"
SCHEMA_VERSION = "1.1"


def posterior_bad(failures: int, runs: int, flake_rate: float) -> float:
    """P(node bad | `failures` of `runs` re-tests failed), prior 1/2, each test wrong with
    probability `flake_rate`."""
    e = min(max(flake_rate, 1e-9), 0.5 - 1e-9)
    passes = runs - failures
    log_bad = failures * math.log(1 - e) + passes * math.log(e)
    log_good = failures * math.log(e) + passes * math.log(1 - e)
    return 1.0 / (1.0 + math.exp(log_good - log_bad))


class _Confirmation(TypedDict, total=False):
    confirm_size: int  # the size of the confirmation's groups (set once the bisection ends)


class BisectSettings(_Confirmation):
    """How the bisection was asked to search."""

    group_size: int | None  # None: chosen from the node count (the grid's: its row)
    min_group: int
    max_bad: int | None
    repeats: int
    flake_rate: float
    parallel: int


class SuspectEntry(TypedDict):
    node: str
    confirmed: bool
    failures: int
    runs: int
    confidence: float
    evidence: list[str]


class BisectDocument(TypedDict):
    """The `gpucheck.bisect` document (`gpucheck bisect --json`)."""

    schema: str
    schema_version: str
    strategy: str
    nodeset: str
    nodes: int
    bad: str
    bad_nodes: list[SuspectEntry]
    cleared: list[SuspectEntry]
    verified: bool
    tests: int
    rounds: int
    search_tests: int
    search_rounds: int
    confirm_tests: int
    confirm_rounds: int
    duration_s: float
    settings: BisectSettings
    notes: list[str]
    records: list[RecordEntry]
    interrupted: str | None
    broken: str | None
    command: str | None
    bandwidth: dict[str, Any] | None  # the pairs screen's document (built-in test)
    unexplained: str | None
    exit_code: int


@dataclass
class Suspect:
    node: str
    failures: int = 0
    runs: int = 0
    confidence: float = 0.0
    confirmed: bool = False
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> SuspectEntry:
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
    settings: BisectSettings = field(default_factory=lambda: BisectSettings(
        group_size=None, min_group=1, max_bad=None, repeats=1, flake_rate=0.0, parallel=0))
    interrupted: str | None = None  # the signal that stopped it (a partial result)
    broken: str | None = None  # why the group test cannot judge the nodes (no node is blamed)
    command: str | None = None  # the group test, for people (the --test command)
    bandwidth: dict[str, Any] | None = None  # the built-in test's bandwidth reference and verdicts
    unexplained: str | None = None  # search tests failed, yet no node is bad: a flaky test or node

    @property
    def bad_nodes(self) -> list[str]:
        return [s.node for s in self.bad]

    @property
    def exit_code(self) -> int:
        if self.interrupted or self.broken:
            return 3
        if not self.verified:
            return 3  # no single bad node explains the failure, whatever was found
        if self.bad:
            return 1
        return 3 if (self.unjudged or self.unexplained) else 0

    @property
    def unjudged(self) -> list[str]:
        """Nodes whose bandwidth could not be judged (built-in test: no reference pair)."""
        bad = set(self.bad_nodes)
        return [n for n in (self.bandwidth or {}).get("unjudged", []) if n not in bad]

    def to_dict(self) -> BisectDocument:
        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
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
            "broken": self.broken,
            "command": self.command,
            "bandwidth": self.bandwidth,
            "unexplained": self.unexplained,
            "exit_code": self.exit_code,
        }


def search_evidence(records: list[GroupRecord]) -> Callable[[str], list[str]]:
    """node -> the failed tests (other than re-tests) that contained it, one line each."""
    failed = [(r, set(r.nodes)) for r in records if not r.healthy and r.phase not in ("confirm", "control")]

    def lines(node: str) -> list[str]:
        return [f"round {r.round} {r.phase} {r.label} failed" + (f": {r.detail}" if r.detail else "")
                for r, members in failed if node in members]

    return lines
