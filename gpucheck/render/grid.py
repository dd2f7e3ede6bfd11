"""The grids as plain data (no rich): what each cell of a check x GPU or node x check grid
holds, and the non-pass results folded into one line per cause.

A cell folds every result of one check on one column (a GPU, or the node for results that name
no GPU) into its worst status: fail > error > unexamined skip > warn > pass > skip. Cause lines
fold results that say the same thing (status, summary, action, injections) on several checks or
subjects: a lost GPU that every NVML check reports is one line naming the checks, not seven.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..core.result import ResultEntry, Status
from ..core.verdict import Verdict

# Worst first when folding a cell (higher wins). Sweep node states rank above any check status.
RANK = {"skip": 0, "pass": 1, "warn": 2, "unexamined": 3, "error": 4, "timeout": 5, "unreachable": 6, "fail": 7}
# The order cause lines are listed in (most severe first).
CAUSE_ORDER = ("fail", "error", "unexamined", "warn", "skip")
NODE_COLUMN = "node"


def status_key(result: ResultEntry) -> str:
    """A result's status for a grid: its status, or `unexamined` for a skip the run was asked
    to examine (exit 3)."""
    return "unexamined" if result.status is Status.SKIP and result.unexamined else result.status.value


def fold(statuses: Iterable[str]) -> str:
    """The worst of `statuses` (a cell)."""
    return max(statuses, key=lambda s: RANK.get(s, RANK["error"]), default="skip")


def column_of(result: ResultEntry) -> str:
    return f"gpu{result.gpu}" if result.gpu is not None else NODE_COLUMN


def _column_order(column: str) -> tuple[int, int]:
    return (-1, 0) if column == NODE_COLUMN else (0, int(column[3:]))


@dataclass
class VerdictGrid:
    checks: list[str]  # rows, in the verdict's check order
    columns: list[str]  # "node" (when any result names no GPU), then "gpu0", "gpu1", ...
    cells: dict[tuple[str, str], str]  # (check, column) -> folded status; absent: no result there

    def cell(self, check: str, column: str) -> str | None:
        return self.cells.get((check, column))


def _check_order(verdict: Verdict) -> list[str]:
    """The verdict's checks in its order, then any check that has results but no entry."""
    order = [c.id for c in verdict.checks]
    return order + list(dict.fromkeys(r.check for r in verdict.results if r.check not in order))


def verdict_grid(verdict: Verdict) -> VerdictGrid:
    """The check x GPU grid of a verdict."""
    order = _check_order(verdict)
    seen: dict[tuple[str, str], list[str]] = {}
    for r in verdict.results:
        seen.setdefault((r.check, column_of(r)), []).append(status_key(r))
    columns = sorted({col for _, col in seen}, key=_column_order)
    checks = [c for c in order if any((c, col) in seen for col in columns)]
    return VerdictGrid(checks, columns, {k: fold(v) for k, v in seen.items()})


@dataclass
class Cause:
    """Results that say the same thing, on one or more checks and subjects."""

    status: str  # fail, error, unexamined, warn, skip (or pass)
    summary: str
    action: str
    injected: tuple[str, ...] = ()
    checks: list[str] = field(default_factory=list)
    subjects: list[str] = field(default_factory=list)

    def where(self) -> str:
        """'gpu5 clocks,ecc' / 'node xid' / 'gpu1,gpu3 ecc'."""
        return f"{','.join(self.subjects)} {','.join(self.checks)}"


def causes(verdict: Verdict, *, include_pass: bool = False) -> list[Cause]:
    """The results that are not a pass, folded into causes, most severe first (the verdict's
    order within a status)."""
    out: dict[tuple[str, str, str, tuple[str, ...]], Cause] = {}
    for r in verdict.results:
        key_status = status_key(r)
        if key_status == "pass" and not include_pass:
            continue
        key = (key_status, r.summary, r.action.value, r.injected)
        cause = out.setdefault(key, Cause(*key))
        check, subject = r.check, r.subject or NODE_COLUMN
        if check not in cause.checks:
            cause.checks.append(check)
        if subject not in cause.subjects:
            cause.subjects.append(subject)
    rank = {s: i for i, s in enumerate(CAUSE_ORDER)}
    return sorted(out.values(), key=lambda c: rank.get(c.status, len(rank)))


def check_marks(verdict: Verdict) -> tuple[tuple[str, str], ...]:
    """(check, folded status) per check of a verdict, in its order: what a sweep keeps of a
    node's verdict for its node x check grid."""
    worst: dict[str, str] = {}
    for r in verdict.results:
        check, status = r.check, status_key(r)
        if check not in worst or RANK.get(status, RANK["error"]) > RANK.get(worst[check], RANK["error"]):
            worst[check] = status
    order = [c.id for c in verdict.checks]
    checks = [c for c in order if c in worst] + [c for c in worst if c not in order]
    return tuple((sys.intern(c), sys.intern(worst[c])) for c in dict.fromkeys(checks))  # interned: shared by nodes


@dataclass
class SweepGrid:
    checks: list[str]
    rows: list[tuple[str, str, dict[str, str]]]  # (node, node status, {check: status})


def sweep_grid(outcomes: Iterable[Any]) -> SweepGrid:
    """The node x check grid of a sweep's outcomes (gpucheck.fleet.sweep.NodeOutcome: node,
    status, checks), nodes in the order given; checks in the order they were first seen."""
    checks: list[str] = []
    rows = []
    for o in outcomes:
        marks = dict(getattr(o, "checks", ()) or ())
        for c in marks:
            if c not in checks:
                checks.append(c)
        rows.append((o.node, o.status, marks))
    return SweepGrid(checks, rows)
