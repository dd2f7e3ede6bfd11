"""Progress without a terminal (cron, a Slurm prolog or epilog, ssh): plain lines on stderr.

A long check (a burn, POET, the memtest, copy bandwidth, ...) reports progress per GPU through
ctx.progress. On a terminal the live table shows it; without one, `ProgressLines` prints one line
per GPU when its first report arrives and then at least every `interval_s` (10 s) while the check
runs, with the GPU's latest report (and, when it is older than the interval, how old: a worker that
stops answering is the worker pool's to call hung, not this display's). A check that
reports nothing gets a "running" line every interval. Short checks print nothing: a run that is
over within the interval adds no line. The lines are plain text (no rich), one per write.

    gpucheck: burn.gemm gpu0 (10 s): bf16 712.4 TFLOP/s, 0 errors, 71 C, 1980 MHz, 690 W, 20 s left
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, TextIO

from .console import plain

PROGRESS_INTERVAL_S = 10.0

# How known progress keys read; any other scalar key prints as key=value, containers are left out.
_FORMATS: tuple[tuple[str, Callable[[Any], str]], ...] = (
    ("dtype", str),
    ("workload", lambda v: f"workload {v}"),
    ("run", lambda v: f"run {v}"),
    ("pattern", lambda v: f"pattern {v}"),
    ("pass", lambda v: f"pass {v}"),
    ("round", lambda v: f"round {v}"),
    ("what", str),
    ("tflops_median", lambda v: f"{v:.4g} TFLOP/s"),
    ("tflops", lambda v: f"{v:.4g} TFLOP/s"),
    ("gbps", lambda v: f"{v:.4g} GB/s"),
    ("problems", lambda v: f"{v} problems"),
    ("errors", lambda v: f"{v} errors"),
    ("temperature_c", lambda v: f"{v:.0f} C"),
    ("sm_clock_mhz", lambda v: f"{v:.0f} MHz"),
    ("power_w", lambda v: f"{v:.0f} W"),
    ("stalled", lambda v: f"stalled in {v}"),
    ("waited_s", lambda v: f"for {v:.0f} s"),
    ("time_left_s", lambda v: f"{v:.0f} s left"),
)
_KNOWN = {k for k, _ in _FORMATS}
_HIDDEN = {"tflops_windows", "windows", "iterations", "digest", "measured", "current", "bytes_tested",
           "first_error", "throttle_reason_names"}


def describe(info: dict[str, Any]) -> str:
    """A progress report as words: 'bf16 712.4 TFLOP/s, 0 errors, 71 C, 20 s left'."""
    parts = []
    shown_tflops = False
    for key, fmt in _FORMATS:
        value = info.get(key)
        if value is None or (key == "tflops" and shown_tflops):
            continue
        try:
            parts.append(fmt(value))
        except (TypeError, ValueError):
            parts.append(f"{key}={value}")
        shown_tflops = shown_tflops or key == "tflops_median"
    for key, value in info.items():
        if key in _KNOWN or key in _HIDDEN or value is None or isinstance(value, (dict, list, tuple)):
            continue
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return ", ".join(parts) if parts else "working"


class ProgressLines:
    """The run pipeline's display without a terminal (the interface of gpucheck.render.live.LiveStatus:
    started / progress / finished / close)."""

    def __init__(self, stream: TextIO | None = None, *, interval_s: float = PROGRESS_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = float(interval_s)
        self.clock = clock
        self._lock = threading.Lock()
        self._check: str | None = None
        self._check_t0 = 0.0
        self._check_printed = 0.0
        self._latest: dict[str, tuple[dict[str, Any], float]] = {}
        self._printed: dict[str, float] = {}
        self._any_line = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def started(self, check: Any) -> None:
        now = self.clock()
        with self._lock:
            self._check = str(getattr(check, "id", check))
            self._check_t0 = self._check_printed = now
            self._latest.clear()
            self._printed.clear()
            self._any_line = False
        if self._thread is None:
            self._thread = threading.Thread(target=self._ticker, name="gpucheck-progress", daemon=True)
            self._thread.start()

    def progress(self, check_id: str, subject: str, info: dict[str, Any]) -> None:
        now = self.clock()
        with self._lock:
            self._latest[subject] = (dict(info), now)
            if subject not in self._printed:  # the first report of each GPU: at once
                self._emit(self._subject_line(subject, now), subject, now)

    def tick(self) -> None:
        """Print what is due: each GPU whose last line is `interval_s` old, or the check's
        'running' line when it reports nothing."""
        now = self.clock()
        with self._lock:
            if self._check is None:
                return
            due = [s for s in sorted(self._latest, key=_subject_order) if now - self._printed.get(s, 0.0) >= self.interval_s]
            for subject in due:
                self._emit(self._subject_line(subject, now), subject, now)
            if not self._latest and now - self._check_printed >= self.interval_s:
                self._check_printed = now
                self._write(f"gpucheck: {self._check} running ({now - self._check_t0:.0f} s)")

    def finished(self, run: Any) -> None:
        with self._lock:
            if self._any_line:
                status = getattr(getattr(run, "status", None), "value", "")
                self._write(f"gpucheck: {getattr(run, 'check_id', self._check)} {status} "
                            f"({float(getattr(run, 'duration_s', 0.0)):.1f} s)")
            self._check = None
            self._latest.clear()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None

    # -- internals (called with the lock held) ------------------------------------------------
    def _subject_line(self, subject: str, now: float) -> str:
        info, at = self._latest[subject]
        text = f"gpucheck: {self._check} {subject} ({now - self._check_t0:.0f} s): {describe(info)}"
        if now - at >= self.interval_s:  # the figures are the GPU's last report: say how old, not "no report"
            text += f" (as of {now - at:.0f} s ago: its last report)"
        return text

    def _emit(self, text: str, subject: str, now: float) -> None:
        self._printed[subject] = now
        self._write(text)

    def _write(self, text: str) -> None:
        self._any_line = True
        try:
            self.stream.write(plain(text) + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or full stderr never breaks the run
            pass

    def _ticker(self) -> None:
        step = max(0.05, min(1.0, self.interval_s / 4))
        while not self._stop.wait(step):
            try:
                self.tick()
            except Exception:  # a display problem never breaks a check
                pass


def _subject_order(subject: str) -> tuple[int, int, str]:
    digits = subject[3:] if subject.startswith("gpu") else ""
    return (0, int(digits), subject) if digits.isdigit() else (1, 0, subject)
