"""The node side of a sweep knows from the local side whether its standard input is the session
(gpucheck.platform.fanout.session_stdin): with one, an end-of-file at any moment stops the command;
without one (ssh -n, srun --input=none, exec mode) the command is left to its time limit."""

from __future__ import annotations

import pytest
from node_session import run_node_command

from gpucheck.platform.fanout import (NodeRun, SrunSettings, SshSettings, session_stdin, srun_reads_no_stdin,
                                      ssh_reads_no_stdin)
from gpucheck.fleet.sweep import SweepPlan, run_sweep


@pytest.mark.parametrize("options, none", [
    ("", False), ("-q", False), ("-o ConnectTimeout=5 -p 2222", False), ("-l n", False), ("-ln", False),
    ("-oStdinNull=no", False), ("-i /k/n", False), ("'-o' 'BatchMode yes'", False), ("-o 'unbalanced", False),
    ("-n", True), ("-qn", True), ("-Tn", True), ("-p 22 -n", True), ("-f", True), ("-o StdinNull=yes", True),
    ("-oStdinNull=yes", True), ("-o 'StdinNull yes'", True), ("-o stdinnull=TRUE", True),
])
def test_ssh_options_that_take_the_standard_input_away(options, none):
    assert ssh_reads_no_stdin(options) is none


@pytest.mark.parametrize("args, none", [
    ([], False), (["--overlap"], False), (["--input=0"], False), (["-i", "all"], False),
    (["--input=none"], True), (["--input", "none"], True), (["-i", "none"], True), (["-inone"], True),
])
def test_srun_arguments_that_take_the_standard_input_away(args, none):
    assert srun_reads_no_stdin(args) is none


def test_which_fan_outs_have_a_session_input(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERSHELL_CFGDIR", str(tmp_path))  # no site clush.conf in the way
    (tmp_path / "clush.conf").write_text("[Main]\nfanout: 8\n")
    assert session_stdin("ssh") and session_stdin("ssh", ssh=SshSettings(ssh_options="-q"))
    assert not session_stdin("ssh", ssh=SshSettings(ssh_options="-n"))
    assert session_stdin("srun") and not session_stdin("srun", srun=SrunSettings(extra_args=["--input=none"]))
    assert not session_stdin("exec")
    (tmp_path / "clush.conf").write_text("[Main]\nssh_options: -oStrictHostKeyChecking=no -n\n")
    assert not session_stdin("ssh")  # clush.conf's options count too


def test_a_sweep_tells_the_node_whether_to_watch_its_input(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERSHELL_CFGDIR", str(tmp_path))
    seen: dict[str, str] = {}

    def runner(commands, **kw):
        seen.update(commands)
        return {n: NodeRun(node=n, rc=255, stderr="not reached") for n in commands}

    plan = SweepPlan(nodes=["n1"], timeout_s=60)
    for ssh, watched in ((SshSettings(), True), (SshSettings(ssh_options="-n"), False)):
        seen.clear()
        run_sweep(plan, runner=runner, ssh=ssh)
        assert ("read -r" in seen["n1"]) is watched


@pytest.mark.slow
def test_a_command_without_a_session_input_runs_to_its_end(tmp_path):
    """ssh -n: end-of-file at once, and the command still runs to its end with its own status."""
    rc, finished = run_node_command(tmp_path, "sleep 1; touch {marker}; exit 7", end_session_after_s=0,
                                    wait_s=60, session_stdin=False)
    assert rc == 7 and finished


def test_a_session_that_ends_at_once_stops_the_node_command(tmp_path):
    """The worst moment: the session ends before the watcher has even started."""
    rc, finished = run_node_command(tmp_path, "sleep 5; touch {marker}", end_session_after_s=0, wait_s=30)
    assert rc == 143 and not finished  # stopped by SIGTERM before its end

def _pid_in(pid_file) -> int | None:
    """The PID the node command wrote (None when it never started; it writes it first thing)."""
    import time

    for _ in range(100):
        if not pid_file.exists():
            return None
        text = pid_file.read_text()
        if text.endswith("\n"):
            return int(text)
        time.sleep(0.01)  # being written
    return None


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead: its parent (init) has not reaped it yet
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_session_that_ends_while_the_limit_starts_leaves_no_orphan(tmp_path):
    """The node's `timeout` forks its command a few microseconds after it starts; a SIGTERM for
    timeout alone in that moment (coreutils 9.1: before it has recorded its child's PID) ends
    timeout and leaves the command running with no limit at all (issue 26: 8 of 44 stops). The
    watcher signals timeout's process group, which holds the command from its fork on. Stops at
    random early moments (0-3 ms after the start), many times over: the command never outlives
    its session."""
    import os
    import random
    import signal
    import subprocess
    import time

    from gpucheck.fleet.sweep import die_with_session

    rng = random.Random(26)
    orphans, started = [], 0
    for trial in range(400):
        pid_file = tmp_path / f"pid{trial}"
        command = die_with_session(f"echo $$ > {pid_file}; exec sleep 30", 600)
        p = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(0, 0.003))
        p.stdin.close()  # the ssh session ends
        p.wait(timeout=30)
        pid = _pid_in(pid_file)
        deadline = time.monotonic() + 2.0  # the command's own SIGTERM takes a moment
        while pid is not None and _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if pid is not None and _alive(pid):
            orphans.append(pid)
            os.kill(pid, signal.SIGKILL)
        started += pid is not None
    assert not orphans, f"{len(orphans)} of 400 commands outlived their session"
    assert started  # the moments cover commands that had started
