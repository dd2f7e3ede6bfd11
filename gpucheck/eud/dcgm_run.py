"""Running NVIDIA's `dcgmi`: find it, ask whether the host engine answers, run `dcgmi diag`.

Every command runs in its own process group (start_new_session) with a timeout and a cancel
event. Stopping is SIGTERM to the group first: dcgmi's own SIGTERM handler then asks the host
engine to stop the running diagnostic (dcgmi/Diag.cpp `handle_signal_during_diag` -> AbortDiag ->
dcgmStopDiagnostic); after `term_grace_s` the group gets SIGKILL. The diagnostic itself runs in
the host engine's nvvs process, outside dcgmi's group: a dcgmi killed before it could ask for the
stop leaves that run to finish on its own (the next `dcgmi diag` waits for it or is refused).

gpucheck never passes `--parameters`, `--configfile` or any option that changes what DCGM does
to the GPUs: only the level (`-r`), JSON output (`-j`), the GPU list (`-i`) and the host engine
address (`--host`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from ..platform.processes import kill_group


@dataclass
class CommandOutput:
    argv: list[str]
    returncode: int | None  # None: killed by gpucheck (timeout or cancel)
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    cancelled: bool = False
    killed: bool = False  # SIGKILL was needed
    error: str | None = None  # could not start it at all

    def tail(self, n: int = 6) -> list[str]:
        """The last lines of stdout and stderr, for evidence."""
        lines = []
        for name, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            for line in text.strip().splitlines()[-n:]:
                lines.append(f"{name}: {line}")
        return lines


def find_dcgmi(setting: str) -> str | None:
    """The dcgmi executable: `setting` is a name looked up on PATH ("dcgmi") or a path."""
    if not setting:
        return None
    if os.sep in setting:
        return setting if os.path.isfile(setting) and os.access(setting, os.X_OK) else None
    return shutil.which(setting)


def run_command(argv: list[str], *, timeout_s: float, cancel: threading.Event | None = None,
                term_grace_s: float = 10.0, cancel_grace_s: float = 2.5, kill_wait_s: float = 5.0,
                poll_s: float = 0.2, env: dict[str, str] | None = None) -> CommandOutput:
    """Run `argv` in a new process group; stop the whole group on timeout or cancel (SIGTERM,
    then SIGKILL after term_grace_s, or cancel_grace_s when cancelled: the runner gives a
    cancelled check 5 s). Never raises for the command's failure; never waits past
    timeout_s + term_grace_s + kill_wait_s (plus one poll)."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, env=env, text=True, errors="replace")
    except OSError as e:
        return CommandOutput(list(argv), None, "", "", 0.0, error=f"{type(e).__name__}: {e}")
    out = CommandOutput(list(argv), None, "", "", 0.0)
    chunks: tuple[str, str] | None = None
    deadline = t0 + max(0.0, timeout_s)
    while True:
        wait = min(poll_s, max(0.0, deadline - time.monotonic()))
        try:
            chunks = proc.communicate(timeout=wait if wait > 0 else 0.001)
            break
        except subprocess.TimeoutExpired:
            pass
        if cancel is not None and cancel.is_set():
            out.cancelled = True
            break
        if time.monotonic() >= deadline:
            out.timed_out = True
            break
    if chunks is None:  # stop the group: SIGTERM, grace, SIGKILL
        kill_group(proc.pid, signal.SIGTERM)
        grace = min(term_grace_s, cancel_grace_s) if out.cancelled else term_grace_s
        try:
            chunks = proc.communicate(timeout=max(0.001, grace))
        except subprocess.TimeoutExpired:
            out.killed = True
            kill_group(proc.pid, signal.SIGKILL)
            try:
                chunks = proc.communicate(timeout=min(kill_wait_s, 1.5) if out.cancelled else kill_wait_s)
            except subprocess.TimeoutExpired:  # a member that left the group keeps the pipe open
                for f in (proc.stdout, proc.stderr):
                    try:
                        if f is not None:
                            f.close()
                    except Exception:  # noqa: BLE001
                        pass
                chunks = ("", "")
        # Whatever else is left in the group (children that outlived their parent) goes too.
        kill_group(proc.pid, signal.SIGKILL)
    out.stdout, out.stderr = chunks[0] or "", chunks[1] or ""
    out.returncode = proc.returncode if not (out.timed_out or out.cancelled) else None
    out.duration_s = time.monotonic() - t0
    return out


def _host_args(host: str) -> list[str]:
    return ["--host", host] if host else []


def probe_hostengine(dcgmi: str, *, host: str = "", timeout_s: float = 15.0,
                     cancel: threading.Event | None = None) -> tuple[bool, str]:
    """Whether the DCGM host engine answers (`dcgmi discovery -l`), and what dcgmi said."""
    res = run_command([dcgmi, "discovery", "-l", *_host_args(host)], timeout_s=timeout_s, cancel=cancel,
                      term_grace_s=2.0)
    if res.error:
        return False, f"could not run {dcgmi}: {res.error}"
    if res.timed_out:
        return False, f"`dcgmi discovery -l` did not answer within {timeout_s:g} s"
    if res.cancelled:
        return False, "interrupted"
    text = (res.stdout + "\n" + res.stderr).strip()
    last = " / ".join(line.strip() for line in text.splitlines()[-2:] if line.strip())
    if res.returncode != 0:
        return False, f"`dcgmi discovery -l` exited {res.returncode}: {last or 'no output'}"
    low = text.lower()
    if "unable to connect" in low or "unable to establish" in low or "host engine connection invalid" in low:
        return False, last
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return True, first


def diag_argv(dcgmi: str, level: int, gpus: list[int] | None = None, host: str = "") -> list[str]:
    argv = [dcgmi, "diag", "-r", str(int(level)), "-j"]
    if gpus:
        argv += ["-i", ",".join(str(int(g)) for g in gpus)]
    return argv + _host_args(host)


def run_diag(dcgmi: str, level: int, *, gpus: list[int] | None = None, host: str = "", timeout_s: float,
             cancel: threading.Event | None = None, term_grace_s: float = 30.0) -> CommandOutput:
    """`dcgmi diag -r <level> -j [-i gpus] [--host host]`, stopped on timeout or cancel."""
    return run_command(diag_argv(dcgmi, level, gpus, host), timeout_s=timeout_s, cancel=cancel,
                       term_grace_s=term_grace_s)
