"""Running a log command (journalctl, dmesg) with its output filtered on the fly and a time limit."""

from __future__ import annotations

import subprocess
import threading

from .base import DEFAULT_TIMEOUT_S
from .linefilter import NEEDLES, Counter, decode_line, iter_relevant_lines


def run_command(argv: list[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                needles: tuple[bytes, ...] = NEEDLES) -> tuple[list[str], int, int, str]:
    """Run `argv`, filter its stdout on the fly. Returns (lines, bytes, returncode, stderr).

    Raises OSError when the command cannot be started; a command that outlives `timeout_s` is
    killed and reported with returncode -9 and a stderr that says so.
    """
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        try:
            proc.kill()
        except OSError:
            pass

    timer = threading.Timer(timeout_s, kill)
    timer.daemon = True
    timer.start()
    err_box: list[bytes] = []
    err_thread = threading.Thread(target=lambda: err_box.append(proc.stderr.read() if proc.stderr else b""),
                                  daemon=True)
    err_thread.start()
    counter = Counter()
    try:
        assert proc.stdout is not None
        lines = [decode_line(b) for b in iter_relevant_lines(proc.stdout, needles=needles, counter=counter,
                                                          chunk_bytes=1 << 20)]
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err_thread.join(2.0)
    stderr = (err_box[0] if err_box else b"").decode("utf-8", "replace").strip()
    if timed_out.is_set():
        return lines, counter.bytes, -9, f"timed out after {timeout_s:g} s"
    return lines, counter.bytes, rc, stderr


def first_line(text: str) -> str:
    for ln in text.splitlines():
        if ln.strip():
            return ln.strip()
    return ""
