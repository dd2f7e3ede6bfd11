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