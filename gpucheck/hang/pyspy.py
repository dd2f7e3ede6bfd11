"""py-spy: find it, run `py-spy dump --json` on one process under a deadline, parse its output.

By default the dump is `--nonblocking`: py-spy reads the process's memory (process_vm_readv) and
never attaches with ptrace, so the process is never paused and a py-spy killed at the deadline
leaves nothing behind. `--native` (C/C++ frames) needs ptrace: py-spy pauses each thread while
it unwinds it; that is opt-in. No signal is ever sent to the dumped process: only py-spy's own
process group is stopped at the deadline or on SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TypedDict

from .model import FrameDoc, ThreadDoc

from ..platform.processes import kill_group
from ..platform.safeio import loads_json

DUMP_ATTEMPTS = 3  # a non-blocking read can race the interpreter; a hung process reads the same
OUTPUT_MAX = 16 << 20


class DumpError(Exception):
    """py-spy's output could not be read as a dump."""


@dataclass
class Frame:
    function: str
    file: str
    line: int | None

    def to_dict(self) -> FrameDoc:
        return {"function": self.function, "file": self.file, "line": self.line}


@dataclass
class Thread:
    name: str
    tid: int | None
    main: bool
    active: bool | None
    frames: list[Frame] = field(default_factory=list)  # innermost first, as py-spy prints them

    def to_dict(self) -> ThreadDoc:
        return {"name": self.name, "tid": self.tid, "main": self.main, "active": self.active,
                "frames": [f.to_dict() for f in self.frames]}


def find_py_spy(explicit: str | None = None) -> str | None:
    """An executable py-spy: `explicit`, else PATH, else next to this Python (pip puts it in the
    interpreter's scripts folder, which a non-login ssh shell's PATH may lack)."""
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    found = shutil.which("py-spy")
    if found:
        return found
    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        path = os.path.join(folder or "", "py-spy")
        if folder and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def py_spy_version(path: str, timeout_s: float = 10.0) -> str | None:
    try:
        p = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout_s,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = p.stdout.split()
    return words[-1] if p.returncode == 0 and words else None


def dump_argv(py_spy: str, pid: int, *, native: bool = False) -> list[str]:
    argv = [py_spy, "dump", "--pid", str(pid), "--json"]
    argv.append("--native" if native else "--nonblocking")
    return argv


def parse_dump(text: str, pid: int) -> list[Thread]:
    """`py-spy dump --json` output (a list of threads; py-spy 0.3.14 to 0.4.x) -> threads."""
    try:
        doc = loads_json(text)
    except ValueError:
        raise DumpError(f"py-spy printed no JSON: {' '.join(text.split())[:200]!r}") from None
    if not isinstance(doc, list):
        raise DumpError("py-spy's JSON is not a list of threads")
    threads = [_thread(t, pid, i) for i, t in enumerate(doc)]
    if not threads:
        raise DumpError("py-spy found no Python thread")
    return threads


def _thread(t: Any, pid: int, i: int) -> Thread:
    if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
        raise DumpError(f"thread {i}: not a py-spy thread")
    tid = t.get("os_thread_id")
    tid = tid if isinstance(tid, int) and not isinstance(tid, bool) else None
    name = t.get("thread_name")
    name = name if isinstance(name, str) else ""
    frames = []
    for j, f in enumerate(t["frames"]):
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("filename"), str):
            raise DumpError(f"thread {i} frame {j}: no function name or file")
        line = f.get("line")
        frames.append(Frame(f["name"], f["filename"], line if isinstance(line, int) and not isinstance(line, bool)
                            else None))
    active = t.get("active")
    return Thread(name=name, tid=tid, main=(tid == pid or name == "MainThread"),
                  active=active if isinstance(active, bool) else None, frames=frames)


class Children:
    """The py-spy processes running now, so that SIGTERM can stop them all (their own groups)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen] = set()
        self.stopped = threading.Event()

    def stop_all(self) -> None:
        self.stopped.set()
        with self.lock:
            for p in list(self.procs):
                kill_group(p.pid, signal.SIGKILL)


def run_dump(argv: list[str], timeout_s: float, children: Children) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr); exit code None when the deadline (or a stop) killed py-spy."""
    if children.stopped.is_set():
        return None, "", "interrupted"
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as e:
        return 127, "", f"cannot run {argv[0]}: {e.strerror or e}"
    with children.lock:
        children.procs.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        rc: int | None = proc.returncode
        if children.stopped.is_set() and rc != 0:
            rc = None
    except subprocess.TimeoutExpired:
        kill_group(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    finally:
        with children.lock:
            children.procs.discard(proc)
    return rc, out[:OUTPUT_MAX].decode("utf-8", "replace"), err[-4096:].decode("utf-8", "replace")


def _error_line(err: str, rc: int | None) -> str:
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    text = lines[-1] if lines else f"py-spy exited {rc}"
    if "Permission" in text or "Operation not permitted" in text:
        text += " (py-spy needs ptrace permission: root, or kernel.yama.ptrace_scope <= 1 for the owner)"
    return text[:300]


class _Dumped(TypedDict, total=False):
    threads: list[Thread]  # dumped
    error: str  # not dumped: why


class DumpOutcome(_Dumped):
    """What dump_process did: the threads, or why not; after how many tries and how long."""

    attempts: int
    duration_s: float


def dump_process(py_spy: str, pid: int, *, timeout_s: float, native: bool, children: Children,
                 attempts: int = DUMP_ATTEMPTS) -> DumpOutcome:
    """Dump one process: {"threads": [...], "attempts", "duration_s"} or {"error", ...}."""
    t0 = time.monotonic()
    why = "not tried"
    for attempt in range(1, attempts + 1):
        rc, out, err = run_dump(dump_argv(py_spy, pid, native=native), timeout_s, children)
        if rc is None:
            why = "interrupted" if children.stopped.is_set() else f"py-spy did not finish within {timeout_s:g} s (killed)"
            break  # a hung py-spy is not retried: the deadline is per process
        if rc == 0:
            try:
                threads = parse_dump(out, pid)
                return {"threads": threads, "attempts": attempt, "duration_s": round(time.monotonic() - t0, 3)}
            except DumpError as e:
                why = str(e)
        else:
            why = _error_line(err, rc)
        if not os.path.exists(f"/proc/{pid}"):
            why = "the process exited"
            break
        time.sleep(0.05 * attempt)
    return {"error": why, "attempts": attempt, "duration_s": round(time.monotonic() - t0, 3)}
