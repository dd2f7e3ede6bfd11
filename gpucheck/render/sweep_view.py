"""A sweep on a terminal: a node x check grid up to GRID_MAX_NODES nodes (one line per bad node
with its failing checks, cause and action below it), else the worst causes with their node
counts and node sets; then the summary lines: counts, the bitwise comparison, the bad nodes as
one folded node set (never wrapped: it is pasted into scontrol), interruption."""

from __future__ import annotations

from typing import Any, Iterable

from ..core.documents import SweepReport
from .console import MARKS, NO_RESULT, STYLES, line, make_console, mark, plain, styled
from .console import legend as mark_legend
from .grid import RANK, sweep_grid
from .terminal import joined, wrapped

GRID_MAX_NODES = 64
WORST_CAUSES = 8
STATUS_W = len("UNREACHABLE")


def print_sweep(outcomes: list[Any], report: SweepReport, strict: bool, file=None, *,
                width: int | None = None, color: bool | None = None) -> None:
    """The sweep's outcomes (gpucheck.fleet.sweep.NodeOutcome) and its report (build_report)."""
    console = make_console(file, width=width, color=color)
    if len(outcomes) <= GRID_MAX_NODES:
        body = grid_lines(outcomes, console.width) + node_lines(outcomes, strict, console.width)
    else:
        body = worst_cause_lines(outcomes, strict, console.width)
    for text in body:
        console.print(text)
    for text in summary_lines(outcomes, report, strict):
        console.file.write(plain(text) + "\n")
    console.file.flush()


def _columns(checks: list[str], fixed: int, width: int) -> tuple[list[str], list[Any]]:
    """Column headers: the check ids when they fit in `width`, else letters with a key line."""
    full = fixed + sum(max(4, len(c)) + 1 for c in checks)
    if full <= width:
        return list(checks), []
    keys = [_letters(i) for i in range(len(checks))]
    parts = [styled(f"{k} {c}") for k, c in zip(keys, checks)]
    parts[0] = line(styled("checks: ", "dim"), parts[0])
    return keys, joined(parts, width, indent=2)


def _letters(i: int) -> str:
    out = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out = chr(65 + r) + out
    return out


def grid_lines(outcomes: Iterable[Any], width: int) -> list[Any]:
    """node | status | one column per check (its folded status on that node; '.' where the
    node ran no such check or gave no verdict). Lettered columns that still do not fit `width`
    are split into blocks of columns, each with the node and status columns."""
    grid = sweep_grid(outcomes)
    node_w = max(4, *(len(n) for n, _, _ in grid.rows)) if grid.rows else 4
    fixed = node_w + 1 + STATUS_W
    headers, legend = _columns(grid.checks, fixed, width)
    per_block = max(1, (width - fixed) // 5) if legend else max(1, len(headers))
    out: list[Any] = []
    for start in range(0, len(headers), per_block):
        out += _block(grid, node_w, headers[start:start + per_block], grid.checks[start:start + per_block])
    shown = {marks.get(c) or NO_RESULT for _, _, marks in grid.rows for c in grid.checks}
    marks_key = mark_legend(shown)
    return out + legend + (joined([marks_key], width, indent=2) if marks_key is not None else [])


def _block(grid: Any, node_w: int, headers: list[str], checks: list[str]) -> list[Any]:
    """The header and one row per node for these check columns."""
    widths = [max(4, len(h)) for h in headers]
    head = f"{'node':<{node_w}} {'status':<{STATUS_W}}" + "".join(f" {h:<{w}}" for h, w in zip(headers, widths))
    out = [styled(head.rstrip(), "bold")]
    for node, status, marks in grid.rows:
        row = line(f"{node:<{node_w}} ", styled(f"{status.upper():<{STATUS_W}}", STYLES.get(status)))
        for check, w in zip(checks, widths):
            got = marks.get(check)
            row.append(" ")
            row.append(mark(got) if got else styled(NO_RESULT, "dim"))
            row.append(" " * (w - len(MARKS.get(got, got) if got else NO_RESULT)))
        row.rstrip()
        out.append(row)
    return out


def failing_text(failing: list[str]) -> str:
    """["ecc:gpu0", "ecc:gpu3", "xid"] -> "ecc[gpu0,gpu3], xid"."""
    groups: dict[str, list[str]] = {}
    for item in failing:
        check, _, subj = item.partition(":")
        groups.setdefault(check, [])
        if subj:
            groups[check].append(subj)
    return ", ".join(f"{c}[{','.join(s)}]" if s else c for c, s in groups.items())


def node_lines(outcomes: Iterable[Any], strict: bool, width: int) -> list[Any]:
    """One line per node that is not a plain pass: status, node, failing checks, cause, action."""
    out = []
    for o in sorted(outcomes, key=lambda o: (-RANK.get(o.status, 0), o.node)):
        if o.status in ("pass", "skip"):
            continue
        failing = failing_text(o.failing)
        cause = o.reason or "-"  # the one story (gpucheck.fleet.sweep.merge_findings holds the fleet's)
        text = line(styled(f"{o.status.upper():<{STATUS_W}}", STYLES.get(o.status)), " ", styled(o.node, "bold"),
                    f" {failing}: " if failing else ": ", cause)
        parts = [text] + ([line("-> ", styled(o.action, "bold"))] if o.action and o.action != "none" else [])
        out += joined(parts, width, indent=STATUS_W + 1)
    return out


def worst_causes(outcomes: Iterable[Any], strict: bool) -> list[tuple[str, str, list[str]]]:
    """(status, cause, nodes) for the nodes that are not a plain pass, grouped by status and
    cause (a node's own name in its cause counts as the same cause), worst status first, then
    the most nodes."""
    groups: dict[tuple[str, str], list[str]] = {}
    for o in outcomes:
        if o.status in ("pass", "skip"):
            continue
        cause = o.reason or o.status
        groups.setdefault((o.status, cause.replace(o.node, "<node>")), []).append(o.node)
    return [(s, c, nodes) for (s, c), nodes in
            sorted(groups.items(), key=lambda kv: (-RANK.get(kv[0][0], 0), -len(kv[1]), kv[0][1]))]


def worst_cause_lines(outcomes: list[Any], strict: bool, width: int) -> list[Any]:
    from ..platform.nodeset import fold

    groups = worst_causes(outcomes, strict)
    if not groups:
        return []
    out = [styled("worst causes:", "bold")]
    for status, cause, nodes in groups[:WORST_CAUSES]:
        text = line("  ", styled(f"{status.upper():<{STATUS_W}}", STYLES.get(status)),
                    f" {len(nodes)} node(s) {fold(nodes)}: {cause}")
        out += wrapped(text, width, indent=STATUS_W + 3)
    if len(groups) > WORST_CAUSES:
        out.append(styled(f"  ... {len(groups) - WORST_CAUSES} more cause(s) (--report or --json has every node)",
                          "dim"))
    return out


def summary_lines(outcomes: list[Any], report: SweepReport, strict: bool) -> list[str]:
    """Plain lines, never wrapped: counts, bitwise, the bad nodes as one node set."""
    counts = ", ".join(f"{n} {s}" for s, n in report["counts"].items() if n)
    out = [f"{len(outcomes)} node(s) in {report['duration_s']:.1f} s: {counts}"]
    bitwise = report["fleet"].get("bitwise")
    bitwise = bitwise if isinstance(bitwise, dict) else {}
    if not bitwise.get("compared", False):
        out.append(f"bitwise comparison: {bitwise.get('why', 'unavailable')}")
    if report["bad"]:
        out.append(f"bad nodes: {report['bad']}")
        for status, ns in report["by_status"].items():
            if status not in ("pass", "skip") and (status != "warn" or strict):
                out.append(f"  {status}: {ns}")
    elif not report.get("interrupted"):
        out.append(healthy_line(report))
    if report.get("interrupted"):
        out.append(f"interrupted by {report['interrupted']}: {len(outcomes)} of {report['planned']} node(s) "
                   f"answered; not answered: {report['unanswered'] or 'none'}")
    return out


def healthy_line(report: SweepReport) -> str:
    """The summary of a sweep without a bad node: "all nodes healthy" only when every node
    passed; else which nodes did not (a warn, such as bits that differ between a node's GPUs
    with no majority to tell which one is wrong, is never healthy)."""
    others = {s: ns for s, ns in report["by_status"].items() if s != "pass"}
    if not others:
        return "all nodes healthy"
    return "no bad node, but not all passed: " + "; ".join(f"{s}: {ns}" for s, ns in others.items())
