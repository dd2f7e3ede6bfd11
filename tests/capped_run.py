"""`gpucheck ARGV` in a child process that cannot hang or eat the test machine, and private
device nodes, for the tests of hostile inputs (FIFOs, devices without end): tests/test_audit_root.py,
tests/test_audit_gate.py, tests/test_hang_inputs.py."""

from __future__ import annotations

import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def private_device(folder: Path, name: str, major: int, minor: int) -> Path:
    """A character device of our own (never the system's /dev nodes)."""
    path = folder / name
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    return path


def run_gpucheck(argv: list[str], *, seconds: float, env: dict[str, str] | None = None,
                 memory_bytes: int = 1 << 30) -> tuple[int | None, str]:
    """(exit code, stderr) of `gpucheck ARGV`; None when it had not ended after `seconds` (then its
    process group is killed). Its address space is capped, so a file read without end fails fast
    instead of eating the machine's memory."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    p = subprocess.Popen([sys.executable, "-m", "gpucheck", *argv], env=env or {**os.environ, "PYTHONPATH": str(ROOT)},
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=cap)
    try:
        _, err = p.communicate(timeout=seconds)
        return p.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return None, "(still running: killed)"
