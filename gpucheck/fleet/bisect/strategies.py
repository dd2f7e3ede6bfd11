"""The two strategies: from the node list to the suspects.

binary  test the whole set; if it fails, search it (gpucheck.fleet.bisect.search): quartering
        with every part of a round at once, or, with --parallel 1, generalized binary
        splitting (one test a round, fewest tests).
grid    two-phase grid (ByteRobust's dual-phase replay): the nodes in rows of `group_size`
        (the job's parallel layout: the nodes one replay needs), every row tested at once;
        then columns: the j-th node of every failing row, padded with nodes of healthy rows
        up to `group_size`, every column at once. One bad node among m x n: two rounds.
        Several failing rows crossing a failing column are searched like binary's, padded to
        the replay's size.
"""

from __future__ import annotations

from dataclasses import dataclass

from .search import Search, pad
from .session import Session


@dataclass
class Found:
    suspects: list[str]
    search: Search
    passed_whole: bool = False  # the whole set passed its first test: nothing to search


def binary_strategy(session: Session, nodes: list[str], *, min_group: int, max_bad: int | None,
                    good: list[str]) -> Found:
    search = Search(session, nodes, min_group=min_group, good=good, max_bad=max_bad, whole_rest=True)
    if search.test(nodes):
        return Found([], search, passed_whole=True)
    return Found(search.find([nodes]), search)


def grid_layout(nodes: list[str], group_size: int, min_group: int = 1) -> list[list[str]]:
    """Rows of `group_size` consecutive nodes; a short last row is merged into the one before
    when it would be smaller than half a row (or than a group)."""
    rows = [nodes[i:i + group_size] for i in range(0, len(nodes), group_size)]
    if len(rows) > 1 and len(rows[-1]) < max(1, group_size // 2, min_group):
        rows[-2].extend(rows.pop())
    return rows


def grid_strategy(session: Session, nodes: list[str], *, group_size: int, min_group: int,
                  max_bad: int | None, good: list[str]) -> Found:
    rows = grid_layout(nodes, group_size, min_group)
    healthy = session.run(rows, "rows")
    bad_rows = [r for r, ok in zip(rows, healthy) if not ok]
    for r, ok in zip(rows, healthy):
        if ok:
            good.extend(r)
    if not bad_rows:
        return Found([], Search(session, nodes, min_group=min_group, good=good, max_bad=max_bad))
    if len(bad_rows) == 1 and not good:
        search = Search(session, nodes, min_group=min_group, good=good, max_bad=max_bad)
        return Found(search.find(bad_rows), search)
    suspects, ambiguous = _columns(session, rows, bad_rows, min_group=min_group, good=good)
    # Groups in the searches below keep the replay's size, padded with known-good nodes.
    search = Search(session, nodes, min_group=max(min_group, group_size if good else min_group), good=good,
                    max_bad=max_bad)
    if ambiguous:
        suspects += search.find(ambiguous)
    if not suspects and not ambiguous:
        # Every column passed although rows failed: a flaky row, or a fault that needs the whole
        # row; search the failing rows.
        suspects += search.find(bad_rows, known_bad=False)
    return Found(suspects, search)


def _columns(session: Session, rows: list[list[str]], bad_rows: list[list[str]], *, min_group: int,
             good: list[str]) -> tuple[list[str], list[list[str]]]:
    """Columns: the j-th node of every row (the nodes of passing rows are known good); only the
    columns that cross a failing row need a test, all in one round. Returns the suspects (the
    crossing of a failing row and a failing column) and the pieces where several failing rows
    cross a failing column."""
    width = max(len(r) for r in rows)
    bad_members = {n for r in bad_rows for n in r}
    columns = [[r[j] for r in rows if j < len(r)] for j in range(width)]
    pieces = [c for c in columns if bad_members.intersection(c)]
    groups: list[list[str]] = []
    used: set[str] = set()
    for p in pieces:
        g = pad(p, good, min_group, avoid=used)
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
            suspects.append(crossing[0])
        else:
            ambiguous.append(crossing)
    return suspects, ambiguous
