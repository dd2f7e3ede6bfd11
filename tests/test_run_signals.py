"""SIGTERM/SIGINT at any moment of a real `gpucheck run`: a parseable verdict, never a death.

A signal that arrives before the verdict is final makes it partial (exit 3, or 1 when a fail was
judged); one that arrives while the final verdict is written changes nothing, and the verdict is
written whole. The offsets count from gpucheck's first line: the moment its handler shows in
/proc/PID/status (SigCgt). Before that the interpreter itself is starting, and nothing a Python
program does can run a handler; test_handlers_are_armed_before_any_heavy_import shows that no
gpucheck work comes before it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAP = str(ROOT / "tests" / "fixtures" / "snapshots" / "h100-healthy.json")
LIVE = ["run", "--level", "1", "--device", "cpu", "--workers", "2", "--json", "--no-history"]
REPLAY = ["run", "--level", "1", "--snapshot", SNAP, "--json", "--no-history"]


def _caught(pid: int, sig: int = signal.SIGTERM) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    except OSError:
        pass
    return False


def _start(argv: list[str]) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "gpucheck", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
    t0 = time.monotonic()
    while not _caught(p.pid) and p.poll() is None:
        assert time.monotonic() - t0 < 30, "gpucheck never armed a SIGTERM handler"
        time.sleep(0.0005)
    return p


def _finish(p: subprocess.Popen) -> tuple[int, dict, str]:
    try:
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode >= 0, f"killed by signal {-p.returncode}: {err[-500:]}"
    v = json.loads(out)  # the whole verdict, never a truncated one
    assert v["exit_code"] == p.returncode
    return p.returncode, v, err


def _assert_interrupted(rc: int, v: dict, name: str = "SIGTERM") -> None:
    assert rc in (1, 3) and v["partial"] and v["interrupted"] == name, (rc, v["interrupted"])
    assert v["status"] in ("error", "fail")


def test_handlers_are_armed_before_any_heavy_import():
    """The console entry installs the handlers before click, the app, the checks, NVML or torch
    are imported (the old code installed them only once the checks started)."""
    code = f"""
import importlib.abc, signal, sys
seen = {{}}
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("click", "gpucheck.app", "gpucheck.tests_suite.registry", "gpucheck.platform.telemetry.snapshot", "torch") \\
                and name not in seen:
            seen[name] = signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
        return None
sys.meta_path.insert(0, Spy())
sys.argv = ["gpucheck", "run", "--level", "1", "--snapshot", {SNAP!r}, "--json", "--no-history"]
from gpucheck.cli.start import entry
try:
    entry()
except SystemExit:
    pass
print("SEEN", seen, file=sys.stderr)
assert seen and all(seen.values()), seen
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("offset_s", [0.0, 0.02, 0.1, 0.5])
def test_sigterm_at_an_offset_gives_a_partial_verdict(offset_s):
    """0 ms, 20 ms, 100 ms after gpucheck's first line (config, check imports, telemetry), and
    0.5 s (CPU workers importing torch)."""
    p = _start(LIVE)
    time.sleep(offset_s)
    p.send_signal(signal.SIGTERM)
    rc, v, _ = _finish(p)
    _assert_interrupted(rc, v)


@pytest.mark.slow
def test_sigint_during_the_compute_check_gives_a_partial_verdict():
    p = _start(LIVE)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    rc, v, _ = _finish(p)
    _assert_interrupted(rc, v, "SIGINT")


def _workers(proc) -> list:
    import psutil

    out = []
    for c in proc.children():
        try:
            if c.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(c.cmdline()):
                out.append(c)
        except psutil.Error:
            pass
    return out


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.0, 0.03, 0.1])
def test_sigterm_just_after_the_checks_end_gives_a_whole_verdict(after_s):
    """The compute check runs last (xid skipped, so nothing runs after it): its two workers exit
    as the checks end, and the signal follows 0, 30 or 100 ms later, while the runner returns,
    the verdict is built or written. A whole verdict every time; a partial one when the signal
    came before the checks ended."""
    psutil = pytest.importorskip("psutil")
    p = _start([*LIVE, "--skip", "xid"])
    armed = time.monotonic()
    proc = psutil.Process(p.pid)
    seen = False
    while time.monotonic() - armed < 90 and p.poll() is None:
        kids = _workers(proc)
        seen = seen or len(kids) >= 2
        if seen and not kids:
            break
        time.sleep(0.002)
    assert seen, "the workers never started"
    time.sleep(after_s)
    sent = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rc, v, _ = _finish(p)
    if after_s == 0.0 or sent - armed + 0.02 < v["duration_s"]:
        _assert_interrupted(rc, v)


@pytest.mark.slow
def test_sigterm_while_the_verdict_is_written_never_truncates_it():
    """The replayed 8-GPU verdict (about 130 KiB) fills the stdout pipe, which nobody reads yet:
    gpucheck blocks in the middle of writing it. The signal arrives there. The old code died
    (default handlers were back); an interrupted write to a pipe could also lose the end of the
    text. The verdict was final before the signal: it is written whole and its code stands."""
    import fcntl
    import termios
    from array import array

    p = _start(REPLAY)
    t0 = time.monotonic()
    buf = array("i", [0])
    while True:  # the pipe is full (64 KiB): the writer is blocked in write(2)
        fcntl.ioctl(p.stdout.fileno(), termios.FIONREAD, buf, True)
        if buf[0] >= 65536 or p.poll() is not None:
            break
        assert time.monotonic() - t0 < 60
        time.sleep(0.005)
    time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    rc, v, _ = _finish(p)
    assert len(v["results"]) > 50 and rc == v["exit_code"] == 0 and not v["partial"]


@pytest.mark.slow
def test_sigterm_at_every_moment_of_a_replay_run():
    """Every 10 ms from gpucheck's first line through its exit: a whole verdict each time, and
    a partial one (exit 3) whenever the signal came before the checks ended."""
    partial = 0
    for step in range(40):
        p = _start(REPLAY)
        armed = time.monotonic()  # at most a few ms after the handler was installed
        time.sleep(step * 0.01)
        if p.poll() is not None:
            _finish(p)
            break
        sent = time.monotonic()
        p.send_signal(signal.SIGTERM)
        rc, v, _ = _finish(p)  # a whole verdict whose exit code is the process's
        if sent - armed + 0.02 < v["duration_s"]:  # certainly before the checks ended
            _assert_interrupted(rc, v)
        partial += bool(v["partial"])
    assert partial >= 3
