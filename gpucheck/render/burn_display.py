"""A live table for long compute checks (the burn): per GPU, dtype, TFLOP/s, temperature, SM
clock, power, errors, time left. Fed by the checks' progress callbacks (ctx.progress), so it
stays out of the check logic.

It has the interface of gpucheck.render.live.LiveStatus (started / progress / finished / close), so the
run pipeline can use either; rich is imported only when a display is made (TTY, not --json).
Without a terminal the pipeline prints progress lines instead (gpucheck.render.progress). The
console never reads markup or emoji codes in what it shows (gpucheck.render.console).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

_COLUMNS = (
    ("gpu", "right"),
    ("dtype", "left"),
    ("TFLOP/s", "right"),
    ("temp C", "right"),
    ("SM MHz", "right"),
    ("power W", "right"),
    ("errors", "right"),
    ("left s", "right"),
)


def _num(v: Any, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) else "-"


class BurnDisplay:
    """rich Live table; one row per subject (gpu0, gpu1, ...)."""

    def __init__(self, file: TextIO | None = None, refresh_per_second: float = 2.0):
        from rich.live import Live

        from .console import make_console

        self.console = make_console(file or sys.stderr)
        self._rows: dict[str, dict[str, Any]] = {}
        self._check = ""
        self._lock = threading.Lock()
        self._live = Live(self._render(), console=self.console, refresh_per_second=refresh_per_second,
                          transient=False, auto_refresh=True)
        self._started = False

    def _render(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        table = Table(title=Text(f"gpucheck {self._check}".strip()), header_style="bold", expand=False)
        for name, justify in _COLUMNS:
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        with self._lock:
            rows = sorted(self._rows.items(), key=lambda kv: (len(kv[0]), kv[0]))
        for subject, r in rows:
            errors = r.get("errors", 0)
            err = Text(str(errors), style="bold red") if isinstance(errors, int) and errors else _num(errors, "d")
            table.add_row(
                Text(subject.removeprefix("gpu")),
                Text(str(r.get("dtype", "-"))),
                _num(r.get("tflops_median", r.get("tflops")), ".4g"),
                _num(r.get("temperature_c"), ".0f"),
                _num(r.get("sm_clock_mhz"), ".0f"),
                _num(r.get("power_w"), ".0f"),
                err,
                _num(r.get("time_left_s"), ".0f"),
            )
        return table

    def started(self, check: Any) -> None:
        self._check = getattr(check, "id", str(check))
        with self._lock:
            self._rows.clear()
        if not self._started:
            self._live.start()
            self._started = True
        self._live.update(self._render())

    def progress(self, check_id: str, subject: str, info: dict[str, Any]) -> None:
        with self._lock:
            self._rows.setdefault(subject, {}).update(info)
        if self._started:
            self._live.update(self._render())

    def finished(self, run: Any) -> None:
        from .live import finished_line

        text = finished_line(run)  # only a check that did not pass leaves a line above the grid
        if text is not None:
            self.console.print(text)

    def close(self) -> None:
        if self._started:
            self._live.update(self._render())
            self._live.stop()
            self._started = False
