"""The node verdict on a terminal: one check x GPU grid, the non-pass results with cause and
action (one line per cause), the nccl-tests table of `nccl.intra`, and the node line. `-v`
prints the full table (one row per result) instead of the grid.

A healthy 8-GPU node at level 1 fits 15 lines at 80 columns: the title, the grid's header and
one row per check, the skipped checks as one paragraph, the node line.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

from .console import MARKS, NO_RESULT, STYLES, line, make_console, mark, styled
from .grid import NODE_COLUMN, Cause, causes, verdict_grid

CAUSE_INDENT = 6
_ORDER = {"fail": 0, "error": 1, "warn": 2, "pass": 3, "skip": 4}


def print_verdict(verdict: Mapping[str, Any], file=None, *, verbose: bool = False, width: int | None = None,
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


def title_line(verdict: Mapping[str, Any]) -> Any:
    """'host  8 x NVIDIA H100 80GB HBM3  driver 550.90.07'."""
    models = Counter(str(g.get("name") or f"GPU ({g.get('state') or 'unknown'})")
                     for g in verdict.get("gpus", []) if isinstance(g, Mapping))
    parts = [str(verdict.get("host", "?"))]
    parts += [f"{n} x {name}" for name, n in models.items()]
    driver = (verdict.get("software") or {}).get("driver")
    if driver:
        parts.append(f"driver {driver}")
    return styled("  ".join(parts), "bold")


def grid_lines(verdict: Mapping[str, Any], width: int) -> list[Any]:
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
    return out


def cause_lines(verdict: Mapping[str, Any], width: int) -> list[Any]:
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


def node_parts(verdict: Mapping[str, Any]) -> list[Any]:
    """The node line's parts: 'host: FAIL (level 1 quick, 0.2 s; 7 fail, 50 pass, 2 skip)',
    'action: reboot', 'partial: SIGTERM', 'exit code 1', 'from snapshot PATH (synthetic)'."""
    c = verdict.get("counts") or {}
    counts = ", ".join(f"{c[s]} {s}" for s in ("fail", "error", "warn", "pass", "skip") if c.get(s))
    status = str(verdict.get("status", "error"))
    parts = [line(styled(str(verdict.get("host", "?")), "bold"), ": ", styled(status.upper(), STYLES.get(status)),
                  f" (level {verdict.get('level')} {verdict.get('level_name')}, "
                  f"{float(verdict.get('duration_s') or 0):.1f} s; {counts})")]
    if verdict.get("action", "none") != "none":
        parts.append(line("action: ", styled(str(verdict["action"]), "bold")))
    if verdict.get("partial"):
        parts.append(styled(f"partial: {verdict.get('interrupted')}", STYLES["error"]))
    parts.append(styled(f"exit code {verdict.get('exit_code')}"))
    source = verdict.get("source") or {}
    if source.get("kind") == "snapshot":
        syn = " (synthetic)" if source.get("synthetic") else ""
        parts.append(styled(f"from snapshot {source.get('path')}{syn}"))
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


def full_table(console: Any, verdict: Mapping[str, Any]) -> None:
    """`-v`: one row per result (status, GPU, check, cause / summary, action)."""
    from rich.table import Table

    table = Table(show_lines=False, header_style="bold", expand=False)
    table.add_column("status")
    table.add_column("gpu", justify="right")
    table.add_column("check")
    table.add_column("cause / summary", overflow="fold")
    table.add_column("action")
    results = sorted(
        [r for r in verdict.get("results", []) if isinstance(r, Mapping)],
        key=lambda r: (_ORDER.get(r.get("status"), 5), str(r.get("check")),
                       -1 if r.get("gpu") is None else r["gpu"], str(r.get("subject"))),
    )
    for r in results:
        gpu = "-" if r.get("gpu") is None else str(r["gpu"])
        if r.get("subject") not in (NODE_COLUMN, f"gpu{r.get('gpu')}"):
            gpu = str(r.get("subject"))
        summary = str(r.get("summary", ""))
        if r.get("injected"):
            summary += f"  [injected: {', '.join(map(str, r['injected']))}]"
        status = "unexamined" if r.get("status") == "skip" and r.get("unexamined") else str(r.get("status"))
        label = "SKIP (unexamined)" if status == "unexamined" else status.upper()
        table.add_row(styled(label, STYLES.get(status)), styled(gpu), styled(str(r.get("check"))), styled(summary),
                      styled(r.get("action") if r.get("action") != "none" else ""))
    console.print(table)
