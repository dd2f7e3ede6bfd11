"""Child-process hygiene shared by everything that starts processes (worker pools, collective
ranks, bisection group tests, launchers, the sweep's fan-out, dcgmi): no child outlives
gpucheck, and a stopped command takes its whole process group with it.

The fleet commands (sweep, bisect, nccl pairs, slurm resume) run inside `stop_on_signals()`:

    with stop_on_signals():
        try:
            result = do_the_work()            # starts children with start() / run() / track()
        except Interrupted as e:
            result = partial(e)               # what was done before the signal; exit 3
        print(result)                         # still inside: a second signal cannot cut it short

On SIGTERM or SIGINT the handler only records the signal and wakes a stopper thread; it never
raises into the code it interrupts. The stopper sends SIGTERM to every process group started
inside the block (each child leads a session of its own, so the signal reaches its
descendants: the shell of a group test and its `sleep`, an ssh or srun client, a launcher and
its ranks), then SIGKILL to the groups still alive after `grace_s` (at once on a second
signal). The code that waits for those children sees them end and calls `check_stop()`, which
raises `Interrupted` at a point where the work can stop cleanly: a result cut short by the stop
is never taken for a judgement. Children started after the signal are killed as they start.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

from .interrupts import INTERRUPTS

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
GRACE_S = 1.0  # SIGTERM -> SIGKILL: ssh and srun clients, shells and ranks end well within it
_POLL_S = 0.05
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def die_with_parent() -> None:
    """In a child: ask Linux to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG).
    Elsewhere a no-op: the parent's deadlines still apply."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def kill_group(pid: int, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to the process group led by `pid` (a child started with start_new_session).
    Never our own group: a `pid` that does not lead a group of its own (a child that has not
    reached its setsid yet) gets the signal alone. False when it is gone or not ours to signal."""
    try:
        try:
            own = os.getpgid(pid) == pid
        except ProcessLookupError:  # the leader is reaped; members of its group may remain
            own = True
        if own and pid != os.getpgrp():
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def group_alive(pid: int) -> bool:
    """Whether any process (a zombie leader included) is left in the group led by `pid`."""
    try:
        os.killpg(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_group(popen: Any, grace_s: float = GRACE_S) -> None:
    """Stop the process group of `popen` (a child started in its own session): SIGTERM, then
    SIGKILL once `grace_s` has passed with the group still there. `popen` needs poll()."""
    kill_group(popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if popen.poll() is not None and not group_alive(popen.pid):
            return
        time.sleep(_POLL_S)
    kill_group(popen.pid, signal.SIGKILL)


class Interrupted(BaseException):
    """The command was asked to stop (SIGTERM/SIGINT). Raised by check_stop() (and by start()
    and run()) in the thread that notices, never from the signal handler. A BaseException, so
    that the `except Exception` of a group test or a fan-out callback does not take it for a
    failed test. `partial` carries what the interrupted step had finished, where it says so."""

    def __init__(self, signame: str, partial: Any = None):
        super().__init__(signame)
        self.signame = signame
        self.partial = partial


class _Stop:
    """The state of one stop_on_signals block: the signal (None until one comes), the process
    groups started inside it, and the stopper thread. The signal handler only sets `signame`
    and writes a byte to a pipe (no lock: it runs between two bytecodes of the main thread,
    which may hold any lock); the stopper thread reads the pipe and does the killing."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.signame: str | None = None
        self.groups: set[int] = set()
        self.lock = threading.Lock()
        self.urgent = False  # a second signal: SIGKILL without waiting out the grace
        self.stopped = threading.Event()  # the stopper thread is done
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self.thread = threading.Thread(target=self._stopper, name="gpucheck-stopper", daemon=True)

    def _poke(self, what: bytes) -> None:
        with contextlib.suppress(OSError):  # a full pipe already holds a wake-up
            os.write(self._w, what)

    def request(self, signame: str) -> None:
        """From the signal handler."""
        if self.signame is None:
            self.signame = signame
            self._poke(b"s")
        else:
            self._poke(b"u")

    def close(self) -> None:
        self._poke(b"c")

    def track(self, pid: int) -> None:
        with self.lock:
            self.groups.add(pid)
        if self.signame is not None:  # started after the signal: nothing of it needs a grace
            kill_group(pid, signal.SIGKILL)

    def untrack(self, pid: int) -> None:
        with self.lock:
            self.groups.discard(pid)

    def _tracked(self) -> set[int]:
        with self.lock:
            return set(self.groups)

    def _wait_poke(self, timeout_s: float) -> None:
        """Sleep up to `timeout_s`; a second signal meanwhile makes it urgent."""
        ready, _, _ = select.select([self._r], [], [], timeout_s)
        if ready:
            self.urgent = self.urgent or b"u" in os.read(self._r, 64)

    def kill_all(self) -> None:
        """SIGTERM every tracked group; SIGKILL those still tracked and alive after the grace
        (at once after a second signal). A group leaves the set when its owner has waited for
        its leader, so no pid here can have been reused."""
        first = self._tracked()
        for pid in first:
            kill_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while not self.urgent and time.monotonic() < deadline:
            if not any(group_alive(p) for p in first & self._tracked()):
                break
            self._wait_poke(min(_POLL_S, max(0.0, deadline - time.monotonic())))
        for pid in self._tracked():
            if group_alive(pid):
                kill_group(pid, signal.SIGKILL)

    def _stopper(self) -> None:
        try:
            what = os.read(self._r, 1)
            if what in (b"s", b"u"):
                self.kill_all()
        finally:
            self.stopped.set()

    def dispose(self) -> None:
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)


_active: _Stop | None = None
_active_lock = threading.Lock()


@contextlib.contextmanager
def stop_on_signals(grace_s: float = GRACE_S) -> Iterator[None]:
    """Install SIGTERM/SIGINT handlers that stop every child started inside the block (see the
    module's docstring). Nested blocks share the outer one. Outside the main thread no handler
    can be installed: the block then only tracks children (and stops them if it ends by an
    exception). On the way out, groups still tracked (an exception cut the work short) are
    stopped too, and the previous handlers come back."""
    global _active
    with _active_lock:
        nested = _active is not None
        if not nested:
            _active = stop = _Stop(grace_s)
    if nested:
        yield
        return
    old: dict[int, Any] = {}
    try:
        if threading.current_thread() is threading.main_thread():
            def handler(signum: int, _frame: Any) -> None:
                stop.request(signal.Signals(signum).name)

            for sig in STOP_SIGNALS:
                old[sig] = signal.signal(sig, handler)
            if early := INTERRUPTS.take():  # arrived while the command started and planned
                stop.request(early)
        stop.thread.start()
        yield
    finally:
        stop.close()
        if stop.thread.is_alive():
            stop.stopped.wait(stop.grace_s + 5.0)
        if stop._tracked():  # left behind by an exception
            stop.kill_all()
        with _active_lock:
            _active = None
        for sig, previous in old.items():
            signal.signal(sig, previous)
        stop.dispose()


def stopping() -> str | None:
    """The name of the signal that asked the running command to stop, or None."""
    stop = _active
    return stop.signame if stop is not None else None


def check_stop() -> None:
    """Raise Interrupted when a signal asked the running command to stop."""
    name = stopping()
    if name is not None:
        raise Interrupted(name)


def track(pid: int) -> None:
    """Stop the process group led by `pid` (a child in a session of its own, started by code
    that is not start(): ClusterShell's fan-out) with the running command. Killed at once when
    the stop has already been asked for."""
    stop = _active
    if stop is not None:
        stop.track(pid)


def untrack(pid: int) -> None:
    """The child `pid` has ended and been waited for: stop tracking its group."""
    stop = _active
    if stop is not None:
        stop.untrack(pid)


def start(argv: list[str], **popen_kw: Any) -> subprocess.Popen:
    """subprocess.Popen(argv) in a session of its own (its descendants stay in its process
    group), tracked until untrack(p.pid). Raises Interrupted instead of starting anything once
    a stop has been asked for (and OSError as Popen does)."""
    check_stop()
    p = subprocess.Popen(argv, start_new_session=True, **popen_kw)
    track(p.pid)
    return p


@dataclass
class Finished:
    rc: int | None  # None: it timed out and was killed
    stdout: str
    stderr: str
    timed_out: bool = False


def run(argv: list[str], *, timeout_s: float | None = None, grace_s: float = GRACE_S) -> Finished:
    """Run `argv` to completion with start() (stdin /dev/null, output captured as text). Past
    `timeout_s` its process group is stopped (SIGTERM, SIGKILL after `grace_s`) and the run is
    `timed_out`. Raises Interrupted when a stop is asked for while it runs (its group is stopped
    first): an interrupted run is no result. Output still held open by a process that left the
    group is given up `grace_s` after the group is gone."""
    p = start(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    timed_out = False
    try:
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                out, err = p.communicate(timeout=0.1 if left is None else min(0.1, left))
                break
            except subprocess.TimeoutExpired:
                if stopping() is not None or (left is not None and left <= 0):
                    timed_out = stopping() is None
                    stop_group(p, grace_s)
                    out, err = _drain(p, grace_s)
                    break
    finally:
        if p.poll() is None:
            kill_group(p.pid)
            p.wait()
        untrack(p.pid)
    check_stop()
    return Finished(None if timed_out else p.returncode, out, err, timed_out)


def _drain(p: subprocess.Popen, grace_s: float) -> tuple[str, str]:
    """What is left of a stopped child's output, waiting at most `grace_s` for it."""
    try:
        return p.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        for f in (p.stdout, p.stderr):
            with contextlib.suppress(OSError):
                if f is not None:
                    f.close()
        p.wait()
        return "", ""
