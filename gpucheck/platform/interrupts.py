"""SIGTERM and SIGINT for the run pipeline: recorded, never fatal, from the first line of the
command until its last output is written.

A Slurm prolog timeout or a Ctrl-C may arrive at any moment: while Python imports gpucheck, while
NVML is read, between two checks, while the verdict is written. The handler only records the
signal (its name, how many arrived) and wakes whoever listens (the runner's cancel event); the
pipeline looks at the record at its own safe points and turns it into a partial verdict. Nothing
is raised from a handler, so no half-done step (a list append, a file write) is ever torn; while
the final verdict is written the signals are held (blocked), so no write is cut short either.

`INTERRUPTS` is the process's recorder. `gpucheck.cli.start.entry` arms it before anything else,
for every command: the commands that produce a verdict keep it (`app.execute` arms it when a
caller in-process has not, and restores the previous handlers when it is done); the fleet
commands and `hang` take what it recorded when their own handling starts (`take`), and every
other command gets Python's handlers back before it begins (`hand_back`), or does not begin.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupts:
    """The signals received since `arm()`: `reason` (the first one's name), `count`."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.count = 0
        self.armed_at: float | None = None  # time.monotonic() when armed: the run's start
        self._previous: dict[int, Any] = {}
        self._listeners: list[threading.Event] = []
        self._held: set[Any] | None = None  # the signal mask before hold()

    @property
    def armed(self) -> bool:
        return self.armed_at is not None

    def arm(self) -> bool:
        """Install the handlers (main thread only). True when this call installed them; False when
        they were already installed or this is not the main thread."""
        if self.armed or threading.current_thread() is not threading.main_thread():
            return False
        self.reason, self.count, self._listeners = None, 0, []
        self.armed_at = time.monotonic()
        held = signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNALS))  # both at once: no SIGINT
        try:  # between the two finds Python's KeyboardInterrupt
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return True

    def disarm(self) -> None:
        """Restore the handlers that were there before `arm()`."""
        if not self.armed:
            return
        for sig, old in self._previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self._previous.clear()
        self.armed_at = None

    def hold(self) -> None:
        """Block SIGTERM/SIGINT in this (the main) thread until release(): once the verdict is
        final, its outputs are written whole. A signal meanwhile is delivered at release(), or
        to another thread (recorded either way); an interrupted write(2) could otherwise return
        short, and CPython's text stdout then loses the rest of a large verdict."""
        if self._held is None and threading.current_thread() is threading.main_thread():
            self._held = signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNALS))

    def release(self) -> None:
        if self._held is not None:
            old, self._held = self._held, None
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def settle(self) -> None:
        """After the command's last output: ignore SIGTERM/SIGINT until the process exits. Its
        verdict is written and its exit code decided; Python's finalization would put the default
        action back on every signal it handles, and a signal in those last milliseconds would
        then kill the process and replace its exit code with "killed by SIGTERM"."""
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                signal.signal(sig, signal.SIG_IGN)

    def take(self) -> str | None:
        """For a command that installs its own SIGTERM/SIGINT handling once it has started (a fleet
        command's stop_on_signals, hang's): the signal that arrived before (while Python imported
        the command, parsed and planned), now that command's to act on; the record is cleared.
        None when none came."""
        reason, self.reason, self.count = self.reason, None, 0
        return reason

    def hand_back(self) -> str | None:
        """For a command that keeps Python's default handling (a SIGINT is KeyboardInterrupt,
        which gpucheck.cli.main turns into exit 3): restore the previous handlers and return the
        signal that arrived since `arm()`, if any (the command must then not begin). Signals are
        blocked meanwhile, so that none falls between the look and the restore: one that does is
        delivered to the restored handler."""
        if not self.armed or threading.current_thread() is not threading.main_thread():
            return self.reason
        old = signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNALS))
        try:
            reason = self.reason
            self.disarm()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return reason

    def listen(self, event: threading.Event) -> None:
        """Set `event` on every signal (at once when one already arrived)."""
        self._listeners.append(event)
        if self.reason is not None:
            event.set()

    def _handle(self, signum: int, _frame: Any) -> None:
        self.count += 1
        if self.reason is None:
            self.reason = signal.Signals(signum).name
        for event in list(self._listeners):
            event.set()


INTERRUPTS = Interrupts()
