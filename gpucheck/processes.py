"""Child-process hygiene shared by everything that starts processes (worker pools, collective
ranks, bisection group tests, launchers, dcgmi): no child outlives gpucheck, and a stopped
command takes its whole process group with it."""

from __future__ import annotations

import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


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
    False when the group is gone or not ours to signal."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
