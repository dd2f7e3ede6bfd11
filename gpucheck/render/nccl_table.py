"""nccl-tests' table for gpucheck's collectives: `gpucheck nccl run` on a terminal and the
`nccl.intra` results of a verdict.

    # all_reduce: 8 ranks, nccl, data verified on every rank
    #       size         count      type   redop      time     algbw     busbw  #wrong
    #        (B)    (elements)                        (us)    (GB/s)    (GB/s)
         1048576        262144     float     sum     48.21     21.75     38.06       0
    # Avg bus bandwidth    : 38.06 GB/s

Sizes, counts and bandwidths as nccl-tests defines them (gpucheck.nccl.bandwidth): size is the
per-rank buffer, count its float32 elements, algbw = size / time, busbw = algbw x the op's
factor. #wrong counts the elements found wrong by the ranks' own verification.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..core.verdict import Verdict
from .console import STYLES, line, make_console, styled

HEADER = ("#       size         count      type   redop      time     algbw     busbw  #wrong",
          "#        (B)    (elements)                        (us)    (GB/s)    (GB/s)")
REDOP = {"all_reduce": "sum", "reduce_scatter": "sum"}


def wrong_elements(row: Mapping[str, Any]) -> int:
    """Elements found wrong at this size, over every rank: the `wrong` of a sweep row, else the
    sum of `nbad` of its per-rank errors."""
    if isinstance(row.get("wrong"), int):
        return int(row["wrong"])
    return sum(int(e.get("nbad") or 0) for e in row.get("errors") or () if isinstance(e, Mapping))


def _num(v: Any, scale: float = 1.0, fmt: str = ".2f") -> str:
    return format(float(v) * scale, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def table_lines(op: str, rows: Iterable[Mapping[str, Any]], note: str = "") -> list[Any]:
    """The table of one collective: a title comment, the two header lines, one line per size,
    the average bus bandwidth (of the sizes measured)."""
    rows = sorted((r for r in rows if isinstance(r, Mapping)), key=lambda r: int(r.get("bytes") or 0))
    out = [styled(f"# {op}" + (f": {note}" if note else ""), "bold")]
    out += [styled(h, "dim") for h in HEADER]
    busbws = []
    for r in rows:
        nbytes = int(r.get("bytes") or 0)
        count = r.get("count") if isinstance(r.get("count"), int) else nbytes // 4
        wrong = wrong_elements(r)
        text = line(f"{nbytes:>12} {count:>13} {'float':>9} {REDOP.get(op, 'none'):>7} "
                    f"{_num(r.get('time_s'), 1e6):>9} {_num(r.get('algbw_gbs')):>9} {_num(r.get('busbw_gbs')):>9} ")
        text.append(f"{wrong:>7}", style=STYLES["fail"] if wrong else "")
        out.append(text)
        if isinstance(r.get("busbw_gbs"), (int, float)):
            busbws.append(float(r["busbw_gbs"]))
    avg = f"{sum(busbws) / len(busbws):.2f} GB/s" if busbws else "-"
    out.append(styled(f"# Avg bus bandwidth    : {avg}", "bold"))
    return out


def run_tables(outcome: Mapping[str, Any]) -> list[Any]:
    """The tables of a `nccl run` outcome (gpucheck.nccl.report.merge: results, world,
    backend), one per collective in the order run, then its status line."""
    results = [r for r in outcome.get("results") or [] if isinstance(r, Mapping)]
    note = f"{outcome.get('world')} ranks, {outcome.get('backend') or 'unknown backend'}"
    out: list[Any] = []
    for op in dict.fromkeys(str(r.get("op")) for r in results):
        out += table_lines(op, [r for r in results if r.get("op") == op], note)
    status = str(outcome.get("status") or "error")
    shown = {"ok": "pass"}.get(status, status)
    out.append(line(styled(status.upper(), STYLES.get(shown)), ": ", str(outcome.get("summary") or "")))
    return out


def intra_tables(verdict: Verdict) -> list[Any]:
    """The nccl-tests table of each `nccl.intra` result of a verdict that has a size sweep."""
    out: list[Any] = []
    for r in verdict.results:
        sweep = r.metric_value("sweep")
        if r.check != "nccl.intra" or not isinstance(sweep, list) or not sweep:
            continue
        op = r.subject.partition("/")[2] or "collective"
        rows = [row for row in sweep if isinstance(row, dict)]
        out += table_lines(op, rows, f"nccl.intra, {r.metric_value('ranks')} ranks, {r.metric_value('backend')}")
    return out


class RunView:
    """`gpucheck nccl run` on a terminal: the rendezvous port and rank failures as they happen
    (stderr), the nccl-tests table and the outcome at the end (stdout)."""

    def __init__(self, file=None, err=None):
        import sys

        self.console = make_console(file if file is not None else sys.stdout)
        self.err = err if err is not None else sys.stderr

    def event(self, ev: Mapping[str, Any]) -> None:
        kind = ev.get("event")
        if kind == "listening":
            self.err.write(f"gpucheck nccl run: rank 0 listening on port {ev.get('port')}\n")
            self.err.flush()

    def finish(self, reports: list[Mapping[str, Any]], world: int, status: str) -> None:
        """The table of the first rank that has measurements (every rank holds the job's), and
        this invocation's status with the summary of its first rank that did not pass."""
        with_results = [r for r in reports if r.get("results")]
        first_bad = next((r for r in reports if r.get("status") != "ok"), None)
        shown = first_bad or (reports[0] if reports else {})
        outcome = {"results": with_results[0]["results"] if with_results else [], "world": world,
                   "backend": next((r.get("backend") for r in reports if r.get("backend")), None),
                   "status": status, "summary": shown.get("summary") or ("no rank reported" if not reports else "")}
        for text in run_tables(outcome):
            self.console.print(text)
