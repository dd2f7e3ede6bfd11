"""The sweep's remote side over a real sshd (tests/sshd_harness.py): a `gpucheck run` that hangs on
a node must not outlive the sweep there. Three ways a session ends: the sweep's per-node
`--timeout` kills the local ssh (the node sees its session close), the same with `ssh -n` (no
standard input: only the node-side `timeout` limit can end it), and SIGTERM to the sweep.

The "node's gpucheck" records its PID and its `sleep` child's (a duration unique to the test run
marks them); clean-up is by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sshd_harness import SshdHarness, sshd_unavailable  # noqa: E402

from gpucheck.cli.main import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 5.0  # after the sweep returns: the remote side reacts at once, this catches a hang

pytestmark = pytest.mark.root
_why = sshd_unavailable()
if _why:
    pytestmark = [pytest.mark.root, pytest.mark.skip(reason=_why)]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    h = SshdHarness(tmp_path_factory.mktemp("sshd"), {"n1": "127.0.0.1", "n2": "127.0.0.2"})
    h.start()
    try:
        yield h
    finally:
        h.stop()


class Hang:
    """A node's gpucheck that hangs: records its PID and its child's in `pids`."""

    def __init__(self, root: Path):
        self.marker = f"300.{os.getpid()}{int(time.monotonic() * 1000) % 100000:05d}"
        self.pids = root / "pids"
        self.script = root / "node-gpucheck"
        self.script.write_text(f"#!/bin/sh\necho $$ >> {self.pids}\nsleep {self.marker} &\necho $! >> {self.pids}\n"
                               "wait\n")
        self.script.chmod(0o755)

    def recorded(self) -> list[int]:
        return [int(x) for x in self.pids.read_text().split()] if self.pids.exists() else []

    def alive(self) -> list[int]:
        out = []
        for pid in self.recorded():
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if state != "Z" and (self.marker.encode() in cmdline or str(self.script).encode() in cmdline):
                out.append(pid)
        return out

    def gone_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        return not self.alive()

    def cleanup(self) -> None:
        for pid in self.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def hang(tmp_path, sshd, monkeypatch):
    for k, v in sshd.env().items():
        monkeypatch.setenv(k, v)
    h = Hang(tmp_path)
    try:
        yield h
    finally:
        h.cleanup()


@pytest.mark.parametrize("ssh_options", [[], ["--ssh-options=-n"]], ids=["session-closes", "no-stdin"])
def test_a_hung_remote_run_is_gone_after_the_sweep_timeout(hang, capsys, ssh_options):
    """session-closes: killing the local ssh closes the session, the node's watcher stops the
    command. no-stdin (ssh -n: end-of-file at once, so the watcher stands down): the node-side
    `timeout` at the same limit stops it."""
    rc = main(["sweep", "n1", "--remote-cmd", str(hang.script), "--timeout", "4s", "--json", *ssh_options])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["nodes"][0]["status"] == "timeout"
    assert len(hang.recorded()) == 2
    assert hang.gone_within(GONE_WITHIN_S), f"still running on the node: {hang.alive()}"


def test_sigterm_to_the_sweep_stops_the_remote_runs(hang, sshd):
    env = {**os.environ, **sshd.env(), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "gpucheck", "sweep", "n[1-2]", "--remote-cmd", str(hang.script),
                             "--timeout", "10m", "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        while len(hang.recorded()) < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert len(hang.recorded()) == 4, proc.communicate()
        # at once: the node's watcher stops its command at an end-of-file from the start on
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, err
    doc = json.loads(out)
    assert doc["interrupted"] == "SIGTERM" and doc["nodes"] == [] and doc["unanswered"] == "n[1-2]"
    assert hang.gone_within(GONE_WITHIN_S), f"still running on the nodes: {hang.alive()}"
