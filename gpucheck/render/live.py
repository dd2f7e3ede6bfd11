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
        parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items()]
        self._detail[subject] = " ".join(parts)
        if self._status is not None:
            body = "  ".join(f"{s}: {d}" for s, d in sorted(self._detail.items()))
            self._status.update(self._show(f"running {check_id} ...  {body}"))

    def finished(self, run) -> None:
        text = styled(f"{run.status.value:5}", _STYLE.get(run.status.value, ""))
        text.append(f" {run.check_id} ({run.duration_s:.1f} s)")
        self.console.print(text)

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
