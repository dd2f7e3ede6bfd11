"""SIGTERM/SIGINT in the first moments of `gpucheck run`, `sweep`, `nccl pairs`, `bisect` and
`hang`, each a real `gpucheck` process (issue 26: 32 of 36 signals in the first 80 ms ended without
a partial result, 11 of them a KeyboardInterrupt traceback with exit 1, "unhealthy"; the fleet
commands had no handler for 0.2-0.3 s while Python imported them and they planned).

The moments count from gpucheck's first line: the moment its SIGTERM handler shows in
/proc/PID/status (SigCgt), as in tests/test_run_signals.py; before that the interpreter itself is
starting and nothing a Python program does can run a handler, and
test_every_command_arms_before_click_is_imported shows that nothing of gpucheck comes before it.
Whatever the moment: no traceback, the exit code docs/exit-codes.md gives an interrupted run (3),
never 1, never a death by the signal, the command's JSON document says it was interrupted, and no
child (a fake ssh or srun client, the "remote" command, a test, a launcher, their `sleep`) is left.
The fakes are those of tests/test_fleet_signals.py: n1 answers, every other node hangs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_fleet_signals import HEALTHY, ROOT, Fakes
from test_run_signals import _caught

MOMENTS_S = (0.0, 0.003, 0.01, 0.03, 0.06, 0.1, 0.2, 0.3)


def _argv(command: str, fakes: Fakes) -> list[str]:
    return {
        "run": ["run", "--level", "1", "--snapshot", str(HEALTHY), "--json", "--no-history"],
        "sweep": ["sweep", "n[1-2]", "--remote-cmd", f"sh {fakes.gpucheck}", "--snapshot", str(HEALTHY),
                  "--run-arg=--no-history", "--json"],
        "nccl pairs": ["nccl", "pairs", "n[1-4]", "--strategy", "ring", "--launcher",
                       f"sh {fakes.pair} {{host}} {{qcmd}}", "--backend", "gloo", "--json"],
        "bisect": ["bisect", "n[1-8]", "--test", f"sh {fakes.hang} {{nodes}}", "--strategy", "grid",
                   "--group-size", "4", "--json"],
        "hang": ["hang", "n[1-2]", "--match", "no-such-training-process", "--remote-cmd", f"sh {fakes.gpucheck}",
                 "--json"],
    }[command]


def _stop_at(fakes: Fakes, argv: list[str], moment_s: float, sig: int) -> tuple[int, str, str]:
    """Start `gpucheck ARGV`, send `sig` `moment_s` after its handler is armed, collect it."""
    p = subprocess.Popen([sys.executable, "-m", "gpucheck", *argv], env=fakes.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=fakes.root)
    try:
        t0 = time.monotonic()
        while not _caught(p.pid, signal.SIGTERM) and p.poll() is None:  # SIGINT: Python's own from its start
            assert time.monotonic() - t0 < 60, "gpucheck never armed a handler"
            time.sleep(0.0005)
        time.sleep(moment_s)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        return p.returncode, out, err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _judge_run(command: str, rc: int, out: str, err: str, signame: str) -> None:
    assert "Traceback" not in err, err[-2000:]
    assert rc >= 0, f"killed by {signal.Signals(-rc).name}: {err[-500:]}"
    if command == "run" and rc == 0:  # the run was over before the signal
        assert json.loads(out)["exit_code"] == 0
        return
    assert rc == 3, (rc, out[-500:], err[-1000:])
    doc = json.loads(out)
    assert doc["interrupted"] == signame and doc["exit_code"] == 3
    if command == "run":
        assert doc["partial"] and doc["status"] == "error"


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def _leftovers(all_fakes: list[Fakes]) -> list[int]:
    deadline = time.monotonic() + 5.0  # a killed process, or a "remote" one its watcher stops
    while time.monotonic() < deadline and any(f.alive() for f in all_fakes):
        time.sleep(0.05)
    return [pid for f in all_fakes for pid in f.alive()]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "sweep", "nccl pairs", "bisect", "hang"])
def test_a_signal_at_any_early_moment_gives_an_interrupted_result(tmp_path, command):
    """SIGTERM and SIGINT, alternately, at MOMENTS_S (0-300 ms) after the handler is armed, the
    runs side by side (each with fakes of its own)."""
    all_fakes = [Fakes(_folder(tmp_path / str(i))) for i in range(len(MOMENTS_S))]
    sigs = [signal.SIGTERM if i % 2 == 0 else signal.SIGINT for i in range(len(MOMENTS_S))]
    outcomes: dict[int, tuple[int, str, str]] = {}

    def one(i: int) -> None:
        outcomes[i] = _stop_at(all_fakes[i], _argv(command, all_fakes[i]), MOMENTS_S[i], sigs[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(MOMENTS_S))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == list(range(len(MOMENTS_S)))
        for i, (rc, out, err) in sorted(outcomes.items()):
            _judge_run(command, rc, out, err, signal.Signals(sigs[i]).name)
        assert not _leftovers(all_fakes)
    finally:
        for f in all_fakes:
            f.cleanup()


@pytest.mark.parametrize("command", ["run", "sweep", "nccl pairs", "bisect", "hang", "xid", "list"])
def test_every_command_arms_before_click_is_imported(tmp_path, command):
    """The console entry installs the recorder before click (and so before any command module,
    any planning) is imported, whatever the command."""
    argv = {"xid": ["xid"], "list": ["list"]}.get(command) or _argv(command, Fakes(tmp_path))
    code = f"""
import importlib.abc, signal, sys
seen = {{}}
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "click" and name not in seen:
            seen[name] = all(signal.getsignal(s) not in (signal.SIG_DFL, signal.default_int_handler, None)
                             for s in (signal.SIGTERM, signal.SIGINT))
            raise SystemExit(0)
        return None
sys.meta_path.insert(0, Spy())
sys.argv = ["gpucheck", *{argv!r}]
from gpucheck.cli.start import entry
try:
    entry()
except SystemExit:
    pass
print("SEEN", seen)
assert seen == {{"click": True}}, seen
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert p.returncode == 0, (p.stdout, p.stderr[-2000:])


@pytest.mark.slow
def test_a_command_that_keeps_pythons_handling_does_not_begin_after_an_early_signal(tmp_path):
    """`list` (and every command that does not act on a signal itself) gets Python's handlers back
    before it begins; a signal recorded before that stops it there: one line, exit 3."""
    code = """
import os, signal, sys
sys.argv = ["gpucheck", "list"]
from gpucheck.platform.interrupts import INTERRUPTS
real_arm = INTERRUPTS.arm
def arm_then_signal():
    real_arm()
    os.kill(os.getpid(), signal.SIGTERM)  # at once: handled by the recorder
INTERRUPTS.arm = arm_then_signal
from gpucheck.cli.start import entry
entry()
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert (p.returncode, p.stdout) == (3, ""), (p.returncode, p.stdout[-300:], p.stderr[-1000:])
    assert p.stderr == "gpucheck: interrupted by SIGTERM before it began\n"
