"""The node side of a sweep knows from the local side whether its standard input is the session
(gpucheck.fleet.fanout.session_stdin): with one, an end-of-file at any moment stops the command;
without one (ssh -n, srun --input=none, exec mode) the command is left to its time limit."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from gpucheck.fleet.fanout import (NodeRun, SrunSettings, SshSettings, session_stdin, srun_reads_no_stdin,
                                   ssh_reads_no_stdin)
from gpucheck.fleet.sweep import SweepPlan, die_with_session, run_sweep


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


def _kill_group_of(pid_file: Path) -> None:
    try:
        os.killpg(os.getpgid(int(pid_file.read_text())), signal.SIGKILL)
    except (OSError, ValueError):
        pass


def test_a_command_without_a_session_input_runs_to_its_end(tmp_path):
    """ssh -n: end-of-file at once, and the command still runs to its end with its own status."""
    marker, pid_file = tmp_path / "finished", tmp_path / "pid"
    command = die_with_session(f"echo $$ > {pid_file}; sleep 1; touch {marker}; exit 7", 600, session_stdin=False)
    p = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        p.stdin.close()  # at once, as ssh -n does
        rc = p.wait(timeout=60)
    finally:
        _kill_group_of(pid_file)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    assert rc == 7 and marker.exists()


def test_a_session_that_ends_at_once_stops_the_node_command(tmp_path):
    """The worst moment: the session ends before the watcher has even started."""
    marker, pid_file = tmp_path / "finished", tmp_path / "pid"
    command = die_with_session(f"echo $$ > {pid_file}; sleep 5; touch {marker}", 600)
    p = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        p.stdin.close()
        rc = p.wait(timeout=30)
    finally:
        _kill_group_of(pid_file)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    assert rc == 143 and not marker.exists()  # stopped by SIGTERM before its end
