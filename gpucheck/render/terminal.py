"""The node verdict on a terminal: one check x GPU grid, the non-pass results with cause and
action (one line per cause), the nccl-tests table of `nccl.intra`, and the node line. `-v`
prints the full table (one row per result) instead of the grid.

A healthy 8-GPU node at level 1 fits 16 lines at 80 columns: the title, the grid's header and
one row per check, the legend of its marks, the skipped checks as one paragraph, the node line.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..core.result import Action, Status
from ..core.verdict import Verdict
from .console import MARKS, NO_RESULT, STYLES, legend, line, make_console, mark, styled
from .grid import NODE_COLUMN, Cause, causes, status_key, verdict_grid

CAUSE_INDENT = 6
_ORDER = {Status.FAIL: 0, Status.ERROR: 1, Status.WARN: 2, Status.PASS: 3, Status.SKIP: 4}
_COUNTED = (Status.FAIL, Status.ERROR, Status.WARN, Status.PASS, Status.SKIP)  # the node line's order


def print_verdict(verdict: Verdict, file=None, *, verbose: bool = False, width: int | None = None,
                  color: bool | None = None) -> None:
    """The verdict for people: the grid view, or with `verbose` one row per result."""
    console = make_console(file, width=width, color=color)
    if verbose:
        full_table(console, verdict)
    else:
        console.print(title_line(verdict))
        for row in grid_lines(verdict, console.width):
            console.print(row)
        for text in cause_lines(verdict, console.width):
            console.print(text)
        from .nccl_table import intra_tables

        for text in intra_tables(verdict):
            console.print(text)
    for text in joined(node_parts(verdict), console.width, indent=2):
        console.print(text)


def title_line(verdict: Verdict) -> Any:
    """'host  8 x NVIDIA H100 80GB HBM3  driver 550.90.07'."""
    models = Counter(g.name or f"GPU ({g.state or 'unknown'})" for g in verdict.gpus)
    parts = [verdict.host]
    parts += [f"{n} x {name}" for name, n in models.items()]
    driver = verdict.software.get("driver")
    if driver:
        parts.append(f"driver {driver}")
    return styled("  ".join(parts), "bold")


def grid_lines(verdict: Verdict, width: int) -> list[Any]:
    """The grid: a header and one row per check, the GPU columns split into blocks that fit
    `width` (each block repeats the check column; the node column is in the first)."""
    grid = verdict_grid(verdict)
    if not grid.checks:
        return [styled("no result", "dim")]
    check_w = max(len("check"), *(len(c) for c in grid.checks))
    cell_w = max(4, *(len(c) for c in grid.columns))
    per_block = max(1, (width - check_w) // (cell_w + 1))
    blocks = [grid.columns[i:i + per_block] for i in range(0, len(grid.columns), per_block)]
    out = []
    shown = {grid.cell(c, col) or NO_RESULT for c in grid.checks for col in grid.columns}
    for block in blocks:
        out.append(styled(f"{'check':<{check_w}}" + "".join(f" {c:<{cell_w}}" for c in block), "bold"))
        for check in grid.checks:
            row = line(f"{check:<{check_w}}")
            for col in block:
                status = grid.cell(check, col)
                row.append(" ")
                row.append(mark(status) if status else styled(NO_RESULT, "dim"))
                row.append(" " * (cell_w - len(MARKS.get(status, status) if status else NO_RESULT)))
            row.rstrip()
            out.append(row)
    key = legend(shown)
    return out + (wrapped(key, width, indent=2) if key is not None else [])


def cause_lines(verdict: Verdict, width: int) -> list[Any]:
    """One line per cause that is not a pass or a plain skip (wrapped, continuation indented),
    then the plain skips as one paragraph: 'skipped: xid (why); repro.bitwise (why)'."""
    out = []
    plain = []
    for cause in causes(verdict):
        if cause.status == "skip":
            plain.append(cause)
            continue
        out += joined(cause_parts(cause), width, indent=CAUSE_INDENT)
    if plain:
        text = line(styled("skipped:", STYLES["skip"]), " ", "; ".join(_skip_text(c) for c in plain))
        out += wrapped(text, width, indent=2)
    return out


def cause_parts(cause: Cause) -> list[Any]:
    """'FAIL  gpu5 clocks,ecc: GPU 5: GPU is lost (...)', then '-> reboot' (kept whole)."""
    text = line(mark(cause.status), " " * max(1, CAUSE_INDENT - len(MARKS.get(cause.status, cause.status))),
                styled(cause.where(), "bold"), ": ", cause.summary)
    if cause.injected:
        text.append(f"  [injected: {', '.join(cause.injected)}]")
    parts = [text]
    if cause.action != "none":
        parts.append(line("-> ", styled(cause.action, "bold")))
    return parts


def _skip_text(cause: Cause) -> str:
    subjects = [s for s in cause.subjects if s != NODE_COLUMN]
    where = ",".join(cause.checks) + (f" {','.join(subjects)}" if subjects else "")
    return f"{where} ({cause.summary})"


def node_parts(verdict: Verdict) -> list[Any]:
    """The node line's parts: 'host: FAIL (level 1 quick, 0.2 s; 7 fail, 50 pass, 2 skip)',
    'action: reboot', 'partial: SIGTERM', 'exit code 1', 'from snapshot PATH (synthetic)'."""
    c = verdict.counts
    counts = ", ".join(f"{c[s]} {s.value}" for s in _COUNTED if c[s])
    status = verdict.status.value
    parts = [line(styled(verdict.host, "bold"), ": ", styled(status.upper(), STYLES.get(status)),
                  f" (level {int(verdict.level)} {verdict.level_name}, {verdict.duration_s:.1f} s; {counts})")]
    if verdict.action is not Action.NONE:
        parts.append(line("action: ", styled(verdict.action.value, "bold")))
    if verdict.partial:
        parts.append(styled(f"partial: {verdict.interrupted}", STYLES["error"]))
    parts.append(styled(f"exit code {verdict.exit_code}"))
    if verdict.source.kind == "snapshot":
        syn = " (synthetic)" if verdict.source.synthetic else ""
        parts.append(styled(f"from snapshot {verdict.source.path}{syn}"))
    return parts


def joined(parts: list[Any], width: int, *, indent: int, sep: str = "  ") -> list[Any]:
    """Parts filled into lines of `width` cells, never broken inside a part that fits on a line
    (a part longer than a line is wrapped on its own); lines after the first indented."""
    out: list[Any] = []
    current = None
    for part in parts:
        if current is not None and current.cell_len + len(sep) + part.cell_len <= width:
            current.append(sep)
            current.append(part)
            continue
        if current is not None:
            out.append(current)
        lead = "" if not out and current is None else " " * indent
        pieces = wrapped(line(lead, part), width, indent=indent)
        out += pieces[:-1]
        current = pieces[-1]
    if current is not None:
        out.append(current)
    return out


def wrapped(text: Any, width: int, *, indent: int) -> list[Any]:
    """`text` cut into lines of at most `width` cells at spaces, lines after the first indented
    by `indent` (a hanging indent keeps the mark column readable). Styles are kept."""
    import io

    width = max(20, width)
    text = text if not isinstance(text, str) else styled(text)
    if text.cell_len <= width:
        return [text]
    measure = make_console(io.StringIO(), width=width, color=False)
    head = text.wrap(measure, width)[0]
    head.rstrip()
    offset = len(head.plain)
    while offset < len(text.plain) and text.plain[offset] == " ":
        offset += 1
    out = [head]
    for piece in text[offset:].wrap(measure, max(10, width - indent)):
        piece.rstrip()
        out.append(line(" " * indent, piece))
    return out


def full_table(console: Any, verdict: Verdict) -> None:
    """`-v`: one row per result (status, GPU, check, cause / summary, action)."""
    from rich.table import Table

    table = Table(show_lines=False, header_style="bold", expand=False)
    table.add_column("status")
    table.add_column("gpu", justify="right")
    table.add_column("check")
    table.add_column("cause / summary", overflow="fold")
    table.add_column("action")
    results = sorted(verdict.results, key=lambda r: (_ORDER[r.status], r.check, -1 if r.gpu is None else r.gpu,
                                                     r.subject))
    for r in results:
        gpu = "-" if r.gpu is None else str(r.gpu)
        if r.subject not in (NODE_COLUMN, f"gpu{r.gpu}"):
            gpu = r.subject
        summary = r.summary
        if r.injected:
            summary += f"  [injected: {', '.join(r.injected)}]"
        status = status_key(r)
        label = "MISS (not examined)" if status == "unexamined" else status.upper()
        table.add_row(styled(label, STYLES.get(status)), styled(gpu), styled(r.check), styled(summary),
                      styled(r.action.value if r.action is not Action.NONE else ""))
    console.print(table)
