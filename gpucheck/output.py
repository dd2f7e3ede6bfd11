"""Console output: the final table and a live status line. rich is imported here only, so JSON
runs (prologs, sweeps) never pay for it."""

from __future__ import annotations

import sys
from typing import Any

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "error": "magenta", "skip": "dim"}
_ORDER = {"fail": 0, "error": 1, "warn": 2, "pass": 3, "skip": 4}


def print_verdict(verdict: dict[str, Any], file=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(file=file or sys.stdout, highlight=False, soft_wrap=False)
    table = Table(show_lines=False, header_style="bold", expand=False)
    table.add_column("status")
    table.add_column("gpu", justify="right")
    table.add_column("check")
    table.add_column("cause / summary", overflow="fold")
    table.add_column("action")
    results = sorted(
        verdict["results"],
        key=lambda r: (_ORDER[r["status"]], r["check"], -1 if r["gpu"] is None else r["gpu"], r["subject"]),
    )
    for r in results:
        gpu = "-" if r["gpu"] is None else str(r["gpu"])
        if r["subject"] not in ("node", f"gpu{r['gpu']}"):
            gpu = r["subject"]
        summary = r["summary"]
        if r["injected"]:
            summary += f"  [injected: {', '.join(r['injected'])}]"
        table.add_row(
            f"[{_STYLE[r['status']]}]{r['status'].upper()}[/]",
            escape(gpu),
            escape(r["check"]),
            escape(summary),
            r["action"] if r["action"] != "none" else "",
        )
    console.print(table)
    c = verdict["counts"]
    counts = ", ".join(f"{c[s]} {s}" for s in ("fail", "error", "warn", "pass", "skip") if c[s])
    status = verdict["status"]
    line = (
        f"[bold]{escape(verdict['host'])}[/]: [{_STYLE[status]}]{status.upper()}[/]"
        f" (level {verdict['level']} {verdict['level_name']}, {verdict['duration_s']:.1f} s; {counts})"
    )
    if verdict["action"] != "none":
        line += f"  action: [bold]{verdict['action']}[/]"
    if verdict["partial"]:
        line += f"  [magenta]partial: {verdict['interrupted']}[/]"
    if verdict["source"]["kind"] == "snapshot":
        syn = " (synthetic)" if verdict["source"]["synthetic"] else ""
        line += f"  from snapshot {escape(str(verdict['source']['path']))}{syn}"
    console.print(line)
    console.print(f"exit code {verdict['exit_code']}", style="dim")


class LiveStatus:
    """A one-line live status on stderr while checks run (TTY only)."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(file=sys.stderr)
        self._status = None
        self._current = ""
        self._detail: dict[str, str] = {}

    def started(self, check) -> None:
        self._current = check.id
        self._detail.clear()
        if self._status is None:
            self._status = self.console.status(f"running {check.id} ...")
            self._status.start()
        else:
            self._status.update(f"running {check.id} ...")

    def progress(self, check_id: str, subject: str, info: dict[str, Any]) -> None:
        parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items()]
        self._detail[subject] = " ".join(parts)
        if self._status is not None:
            body = "  ".join(f"{s}: {d}" for s, d in sorted(self._detail.items()))
            self._status.update(f"running {check_id} ...  {body}")

    def finished(self, run) -> None:
        style = _STYLE.get(run.status.value, "")
        self.console.print(f"[{style}]{run.status.value:5}[/] {run.check_id} ({run.duration_s:.1f} s)")

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
