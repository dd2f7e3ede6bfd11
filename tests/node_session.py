"""A node's command under gpucheck.fleet.sweep.die_with_session, run here as ssh would run it:
`sh -c COMMAND` with a standard input that stands for the session, ended when the test says.
Shared by the tests of the session watcher (tests/test_session_stdin.py, tests/test_audit_root.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def kill_group_of(pid_file: Path) -> None:
    """SIGKILL the process group of the PID in `pid_file` (coreutils timeout runs the command in
    a process group of its own); nothing when the file or the group is gone."""
    try:
        os.killpg(os.getpgid(int(pid_file.read_text())), signal.SIGKILL)
    except (OSError, ValueError):
        pass


def run_node_command(tmp_path: Path, script: str, *, end_session_after_s: float, wait_s: float,
                     session_stdin: bool = True, limit_s: float = 600) -> tuple[int | None, bool]:
    """Run `echo $$ > PID; <script>` (the script may `touch {marker}`) wrapped by die_with_session;
    end the session (close its standard input) after `end_session_after_s`; wait up to `wait_s`
    for it. Returns (its exit status, or None when it still ran; whether {marker} exists). Every
    process it started is killed by its process group before returning."""
    from gpucheck.fleet.sweep import die_with_session

    marker, pid_file = tmp_path / "finished", tmp_path / "pid"
    command = die_with_session(f"echo $$ > {pid_file}; " + script.format(marker=marker), limit_s,
                               session_stdin=session_stdin)
    p = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        if end_session_after_s:
            time.sleep(end_session_after_s)
        p.stdin.close()  # the ssh session ends
        try:
            rc: int | None = p.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            rc = None
    finally:
        kill_group_of(pid_file)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    return rc, marker.exists()
