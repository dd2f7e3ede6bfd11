"""A live status line on a terminal while the checks of a run go (the verdict itself is
gpucheck.render.terminal's: the grid, or the full table with `-v`). rich is imported only when
something is printed, so JSON runs (prologs, sweeps) never pay for it; every console is made by
gpucheck.render.console.make_console (no markup, no emoji: data prints as it is)."""

from __future__ import annotations

import sys
from typing import Any

from .console import STYLES as _STYLE
from .console import make_console, styled


class LiveStatus:
    """A one-line live status on stderr while checks run (TTY only)."""

    def __init__(self) -> None:
        self.console = make_console(sys.stderr)
        self._status: Any = None  # rich's Status, made at the first check
        self._current = ""
        self._detail: dict[str, str] = {}

    def _show(self, text: str) -> Any:
        return styled(text)

    def started(self, check) -> None:
        self._current = check.id
        self._detail.clear()
        if self._status is None:
            self._status = self.console.status(self._show(f"running {check.id} ..."))
            self._status.start()
        else:
            self._status.update(self._show(f"running {check.id} ..."))

    def progress(self, check_id: str, subject: str, info: dict[str, Any]) -> None:
        from .progress import describe

        self._detail[subject] = describe(info)  # words, as the progress lines print them
        if self._status is not None:
            body = "  ".join(f"{s}: {d}" for s, d in sorted(self._detail.items()))
            self._status.update(self._show(f"running {check_id} ...  {body}"))

    def finished(self, run) -> None:
        text = finished_line(run)
        if text is not None:
            self.console.print(text)

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def finished_line(run: Any) -> Any | None:
    """What stays above the grid when a check ends: 'FAIL  burn.gemm (31.0 s)' for a check that
    did not pass; None for a pass or a skip (the grid under it shows those, one row per check)."""
    status = str(getattr(getattr(run, "status", None), "value", ""))
    if status in ("pass", "skip", ""):
        return None
    text = styled(f"{status.upper():5}", _STYLE.get(status, ""))
    text.append(f" {getattr(run, 'check_id', '')} ({float(getattr(run, 'duration_s', 0.0)):.1f} s)")
    return text
