"""scripts/slurm/gpucheck-hook.sh: one wrapper for both Slurm hooks. It picks the hook from the
name it is installed under (or SLURM_SCRIPT_CONTEXT), passes the site's per-hook arguments, runs
gpucheck as a child (signals forwarded), and exits 1 only when gpucheck judged the node
unhealthy (its exit 42): every other outcome of gpucheck (a usage error, a traceback, a python
without the package, not found, killed) is logged with its exit code and the end of its stderr
and follows on-error (pass: exit 0; fail: the wrapper drains with a `gpucheck:` reason, exit 1).

Real scripts run under /bin/sh with fake `logger` and `scontrol` first on the PATH (the settings
file extends the PATH, as a site's may); the fakes append their arguments to files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm" / "gpucheck-hook.sh"
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
HEALTHY, DBE = SNAPS / "h100-healthy.json", SNAPS / "h100-ecc-dbe.json"
REAL = f"/usr/bin/env PYTHONPATH={ROOT} {sys.executable} -m gpucheck"


class Hooks:
    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        for tool in ("logger", "scontrol"):  # scontrol's `show config` (PrologEpilogTimeout): nothing set
            self.fake(self.bin / tool, ('case "$1" in show) exit 0 ;; esac\n' if tool == "scontrol" else "")
                      + f'printf "%s\\n" "$*" >> "{root}/{tool}.calls"\n')
        for name in ("gpucheck-prolog.sh", "gpucheck-epilog.sh", "gpucheck-hook.sh"):
            shutil.copy(SCRIPT, root / name)
        self.settings(gpucheck=self.gpucheck_exiting(0))

    @staticmethod
    def fake(path: Path, body: str) -> str:
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return str(path)

    def gpucheck_exiting(self, rc: int, stderr: str = "") -> str:
        body = 'echo "ARGS: $*"\n'
        if stderr:
            body += f"printf '%s\\n' '{stderr}' >&2\n"
        return self.fake(self.root / f"fake-gpucheck-{rc}", body + f"exit {rc}\n")

    def settings(self, *, gpucheck: str, args: str = "", prolog_args: str = "", epilog_args: str = "",
                 extra: str = "") -> None:
        (self.root / "gpucheck-slurm.env").write_text(
            f'PATH="{self.bin}:$PATH"\nGPUCHECK="{gpucheck}"\nGPUCHECK_ARGS="{args}"\n'
            f'GPUCHECK_PROLOG_ARGS="{prolog_args}"\nGPUCHECK_EPILOG_ARGS="{epilog_args}"\n{extra}')

    def calls(self, tool: str) -> list[str]:
        path = self.root / f"{tool}.calls"
        return path.read_text().splitlines() if path.exists() else []

    def run(self, name: str = "gpucheck-prolog.sh", **env: str) -> subprocess.CompletedProcess:
        base = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1"}
        return subprocess.run(["/bin/sh", str(self.root / name)], env={**base, **env}, capture_output=True,
                              text=True, timeout=120)


@pytest.fixture
def hooks(tmp_path):
    return Hooks(tmp_path)


# -- which hook, which arguments ------------------------------------------------------------------

@pytest.mark.parametrize("name, want", [
    ("gpucheck-prolog.sh", "ARGS: slurm prolog --state-dir /s --budget 9s"),
    ("gpucheck-epilog.sh", "ARGS: slurm epilog --state-dir /s --failed-level 2"),
])
def test_hook_from_the_installed_name(hooks, name, want):
    hooks.settings(gpucheck=hooks.gpucheck_exiting(0), args="--state-dir /s", prolog_args="--budget 9s",
                   epilog_args="--failed-level 2")
    r = hooks.run(name, SLURM_SCRIPT_CONTEXT="epilog_slurmd" if "prolog" in name else "prolog_slurmd")
    assert r.stdout.strip() == want and r.returncode == 0


@pytest.mark.parametrize("context, hook", [("prolog_slurmd", "prolog"), ("epilog_slurmd", "epilog")])
def test_hook_from_slurm_script_context_under_a_neutral_name(hooks, context, hook):
    hooks.settings(gpucheck=hooks.gpucheck_exiting(0), args="--state-dir /s")
    r = hooks.run("gpucheck-hook.sh", SLURM_SCRIPT_CONTEXT=context)
    assert r.stdout.startswith(f"ARGS: slurm {hook} --state-dir /s")


def test_arguments_are_words_never_globbed_or_run(hooks, tmp_path):
    (tmp_path / "planted").write_text("")
    hooks.settings(gpucheck=hooks.gpucheck_exiting(0),  # single quotes: the settings file itself expands nothing
                   extra=f"GPUCHECK_ARGS='--x {tmp_path}/* $(touch {tmp_path}/pwned) `touch {tmp_path}/pwned` a\tb'\n")
    r = hooks.run()
    want = f"ARGS: slurm prolog --x {tmp_path}/* $(touch {tmp_path}/pwned) `touch {tmp_path}/pwned` a b"
    assert r.stdout.strip() == want, r.stdout
    assert not (tmp_path / "pwned").exists()


def test_unknown_hook_passes_by_default_and_fails_closed_on_request(hooks):
    r = hooks.run("gpucheck-hook.sh")
    assert r.returncode == 0 and "cannot tell prolog from epilog" in r.stderr and not r.stdout
    assert hooks.calls("scontrol") == []
    hooks.settings(gpucheck=hooks.gpucheck_exiting(0), extra="GPUCHECK_ON_ERROR=fail\n")
    r = hooks.run("gpucheck-hook.sh")
    assert r.returncode == 1
    (call,) = hooks.calls("scontrol")
    assert call.startswith("update NodeName=n1 State=DRAIN Reason=gpucheck: could not judge: cannot tell prolog")


# -- only exit 42 is a verdict; every other outcome is on-error ---------------------------------------

OUTCOMES = [  # gpucheck's exit status, what the log names
    (1, "crashed"), (2, "usage error"), (3, "could not judge"), (120, "could not write its output"),
    (126, "cannot be executed"), (127, "not found"), (7, "not an outcome of a gpucheck hook"),
]


@pytest.mark.parametrize("rc, meaning", OUTCOMES)
def test_gpucheck_failure_is_logged_and_passes_by_default(hooks, rc, meaning):
    hooks.settings(gpucheck=hooks.gpucheck_exiting(rc, stderr=f"something broke {rc}"))
    r = hooks.run()
    assert r.returncode == 0, r.stderr
    (line,) = hooks.calls("logger")
    assert line.startswith("-t gpucheck -p daemon.warning -- slurm prolog job=42 node=n1: could not judge: "
                           f"gpucheck exited {rc} ({meaning}): something broke {rc}")
    assert line.endswith("-> not drained by the wrapper (on-error pass), exit 0")
    assert hooks.calls("scontrol") == []
    assert f"something broke {rc}" in r.stderr  # gpucheck's stderr still reaches slurmd's log


@pytest.mark.parametrize("rc, meaning", OUTCOMES)
def test_gpucheck_failure_fails_closed_with_a_gpucheck_reason(hooks, rc, meaning):
    hooks.settings(gpucheck=hooks.gpucheck_exiting(rc, stderr="boom"), extra="GPUCHECK_ON_ERROR=fail\n")
    r = hooks.run()
    assert r.returncode == 1
    (call,) = hooks.calls("scontrol")
    cause = f"could not judge: gpucheck exited {rc} ({meaning}): boom"
    # NHC-style: the cause's head (<= 60 characters), its detail in the log line
    assert call == f"update NodeName=n1 State=DRAIN Reason=gpucheck: could not judge: gpucheck exited {rc} ({meaning})"[:98]
    (line,) = hooks.calls("logger")
    assert cause in line  # the whole cause in the log
    assert "-p daemon.err" in line and line.endswith("-> drained (on-error fail), exit 1")


@pytest.mark.parametrize("on_error", ["pass", "fail"])
def test_only_the_unhealthy_code_makes_the_hook_fail(hooks, on_error):
    hooks.settings(gpucheck=hooks.gpucheck_exiting(42), extra=f"GPUCHECK_ON_ERROR={on_error}\n")
    r = hooks.run()
    assert r.returncode == 1 and hooks.calls("logger") == [] and hooks.calls("scontrol") == []  # gpucheck drained
    hooks.settings(gpucheck=hooks.gpucheck_exiting(0), extra=f"GPUCHECK_ON_ERROR={on_error}\n")
    assert hooks.run().returncode == 0 and hooks.calls("logger") == []


@pytest.mark.parametrize("sig", ["KILL", "SEGV"])
def test_gpucheck_killed_by_a_signal(hooks, sig):
    hooks.settings(gpucheck=hooks.fake(hooks.root / "killed", f"kill -{sig} $$\n"))
    r = hooks.run()
    assert r.returncode == 0
    (line,) = hooks.calls("logger")
    assert f"gpucheck exited {128 + getattr(signal, 'SIG' + sig)} (killed by signal {sig})" in line
    hooks.settings(gpucheck=str(hooks.root / "killed"), extra="GPUCHECK_ON_ERROR=fail\n")
    assert hooks.run().returncode == 1
    (call,) = hooks.calls("scontrol")
    reason = f"gpucheck: could not judge: gpucheck exited {128 + getattr(signal, 'SIG' + sig)} (killed by signal {sig})"
    assert call == "update NodeName=n1 State=DRAIN Reason=" + reason[:60]  # NHC-style: <= 60


def test_missing_gpucheck_is_logged_not_a_drain(hooks):
    hooks.settings(gpucheck=f"{hooks.root}/nowhere")
    r = hooks.run()
    assert r.returncode == 0 and hooks.calls("scontrol") == []
    (line,) = hooks.calls("logger")
    assert "gpucheck exited 127 (not found)" in line and f"{hooks.root}/nowhere" in line


def test_a_python_without_the_package(hooks):
    hooks.settings(gpucheck=f"{sys.executable} -I -S -m gpucheck")  # no site-packages, no PYTHONPATH
    r = hooks.run()
    assert r.returncode == 0
    (line,) = hooks.calls("logger")
    assert "gpucheck exited 1 (crashed)" in line and "No module named gpucheck" in line
    hooks.settings(gpucheck=f"{sys.executable} -I -S -m gpucheck", extra="GPUCHECK_ON_ERROR=fail\n")
    assert hooks.run().returncode == 1
    (call,) = hooks.calls("scontrol")
    assert call.startswith("update NodeName=n1 State=DRAIN Reason=gpucheck: could not judge: gpucheck exited 1")


def test_a_traceback_from_a_broken_dependency(hooks, tmp_path):
    broken = tmp_path / "broken" / "click"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('click 99 is half installed')\n")
    hooks.settings(gpucheck=f"/usr/bin/env PYTHONPATH={broken.parent}:{ROOT} {sys.executable} -m gpucheck")
    r = hooks.run()
    assert r.returncode == 0 and "Traceback" in r.stderr
    (line,) = hooks.calls("logger")
    assert "gpucheck exited 1 (crashed)" in line and "ImportError: click 99 is half installed" in line


# -- the real gpucheck behind the wrapper ----------------------------------------------------------

def history(state: Path) -> list[dict]:
    path = state / "history.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_real_gpucheck_judged_fault_drains_and_exits_1(hooks, tmp_path):
    hooks.settings(gpucheck=REAL, args=f"--state-dir {tmp_path}/state --snapshot {DBE}")
    r = hooks.run()
    assert r.returncode == 1, r.stderr
    (call,) = hooks.calls("scontrol")  # gpucheck found the fake scontrol on the wrapper's PATH
    assert call == "update NodeName=n1 State=DRAIN Reason=gpucheck: gpu3 ecc-dbe -> reset-gpu"  # NHC-style, <= 60
    assert [v["status"] for v in history(tmp_path / "state")] == ["fail"]


@pytest.mark.parametrize("bad", ["--budget 5x", "--workers 0", "--level 9", "--no-such-option"])
def test_real_gpucheck_usage_error_in_the_settings_never_drains(hooks, tmp_path, bad):
    hooks.settings(gpucheck=REAL, args=f"--state-dir {tmp_path}/state --snapshot {HEALTHY}", prolog_args=bad)
    r = hooks.run()
    assert r.returncode == 0, r.stderr
    assert hooks.calls("scontrol") == []
    assert "could not judge" in r.stderr and "-> not drained (on-error pass), exit 0" in r.stderr
    (v,) = history(tmp_path / "state")  # recorded: a could-not-judge verdict naming the cause
    assert v["status"] == "error" and v["exit_code"] == 3
    assert v["results"][0]["check"] == "slurm.prolog" and "usage" in v["results"][0]["summary"]


def test_real_gpucheck_usage_error_fails_closed_with_a_gpucheck_reason(hooks, tmp_path):
    hooks.settings(gpucheck=REAL, args=f"--state-dir {tmp_path}/state --workers 0", extra="GPUCHECK_ON_ERROR=fail\n")
    r = hooks.run()
    assert r.returncode == 1, r.stderr
    (call,) = hooks.calls("scontrol")  # drained by gpucheck itself (it exited 42), once
    assert call.startswith("update NodeName=n1 State=DRAIN Reason=gpucheck: could not judge: usage error in the ")
    assert len(call.split("Reason=", 1)[1]) <= 60 and "Invalid value for '--workers'" in r.stderr  # the full cause


# -- on-error from the config, even a broken one, when gpucheck cannot start ------------------------

@pytest.mark.parametrize("config", [
    '[run]\non_error = "fail"\nno_such_key = 1\n',  # valid TOML, invalid config
    "[run]\non_error = 'fail'   # fail closed\n[node\n",  # not TOML at all
    'run.on_error = "fail"\n[checks.ecc]\nx = = 1\n',
])
def test_fail_closed_config_survives_its_own_errors_in_the_wrapper(hooks, tmp_path, config):
    (tmp_path / "config.toml").write_text(config)
    hooks.settings(gpucheck=f"{hooks.root}/nowhere", args=f"--config {tmp_path}/config.toml")
    r = hooks.run()
    assert r.returncode == 1, r.stderr
    (call,) = hooks.calls("scontrol")
    assert call.startswith("update NodeName=n1 State=DRAIN Reason=gpucheck: could not judge: gpucheck exited 127")


def test_on_error_precedence_in_the_wrapper(hooks, tmp_path):
    (tmp_path / "config.toml").write_text('[run]\non_error = "fail"\n')
    (tmp_path / "other.toml").write_text('[checks.x]\non_error = "fail"\n')  # not [run]: no effect
    nowhere = f"{hooks.root}/nowhere"
    cases = [  # (arguments, settings) -> wrapper exit
        (f"--config={tmp_path}/config.toml", "", 1),
        (f"--config {tmp_path}/config.toml", "GPUCHECK_ON_ERROR=pass\n", 0),  # the env file wins
        (f"--config {tmp_path}/config.toml --on-error pass", "GPUCHECK_ON_ERROR=fail\n", 0),  # --on-error wins
        ("--on-error=fail", "GPUCHECK_ON_ERROR=pass\n", 1),
        (f"--config {tmp_path}/other.toml", "", 0),
        (f"--config {tmp_path}/config.toml", "GPUCHECK_ON_ERROR=maybe\n", 1),  # not pass/fail: passed over
    ]
    for args, extra, want in cases:
        hooks.settings(gpucheck=nowhere, args=args, extra=extra)
        assert hooks.run().returncode == want, (args, extra)


def test_fail_closed_never_drains_a_node_list_or_with_no_drain(hooks):
    hooks.settings(gpucheck=hooks.gpucheck_exiting(3), extra="GPUCHECK_ON_ERROR=fail\n")
    r = hooks.run(SLURMD_NODENAME="n[1-99]")
    assert r.returncode == 1 and hooks.calls("scontrol") == []
    assert "not drained ('n[1-99]' is not a single node name)" in hooks.calls("logger")[0]
    hooks.settings(gpucheck=hooks.gpucheck_exiting(3), args="--no-drain", extra="GPUCHECK_ON_ERROR=fail\n")
    assert hooks.run().returncode == 1 and hooks.calls("scontrol") == []


# -- a settings file the shell cannot read ------------------------------------------------------------

@pytest.mark.parametrize("text, why", [
    ('GPUCHECK_ARGS="--budget 5s\n', "not valid shell"),
    ("exit 3\n", "reading it stops the shell"),
    ("readonly PATH\nPATH=/x\n", "reading it stops the shell"),
])
def test_broken_settings_file_is_logged_not_a_drain(hooks, text, why):
    (hooks.root / "gpucheck-slurm.env").write_text(text)
    r = hooks.run()
    assert r.returncode == 0, r.stderr
    assert why in r.stderr and "-> not drained by the wrapper (on-error pass), exit 0" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to another user)")
@pytest.mark.parametrize("plant", ["world-writable", "group-writable", "other-owner", "writable-folder",
                                   "link-to-other-owner"])
def test_a_settings_file_another_user_could_write_is_never_sourced(hooks, tmp_path, plant):
    """The settings file is shell code the hook runs as root: one that a user other than root
    could have written (owned by them, writable by group/others, in a folder others can write, or
    a link to such a file) would run that user's code as root. It is not sourced: the hook logs
    why and follows on-error (here: pass, exit 0), and the planted code never runs."""
    env = hooks.root / "gpucheck-slurm.env"
    marker = tmp_path / "planted-code-ran"
    hooks.settings(gpucheck=hooks.gpucheck_exiting(0), extra=f'touch "{marker}"\n')
    if plant == "world-writable":
        env.chmod(0o666)
    elif plant == "group-writable":
        env.chmod(0o664)
    elif plant == "other-owner":
        os.chown(env, 65534, 65534)
    elif plant == "writable-folder":
        hooks.root.chmod(0o777)
    else:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        real = elsewhere / "slurm.env"
        env.rename(real)
        os.chown(real, 65534, 65534)
        env.symlink_to(real)
    try:
        r = hooks.run()
    finally:
        hooks.root.chmod(0o700)
    assert r.returncode == 0, r.stderr
    assert "not sourced:" in r.stderr and "-> not drained by the wrapper (on-error pass), exit 0" in r.stderr
    assert not marker.exists()


def test_a_root_owned_private_settings_file_is_sourced(hooks, tmp_path):
    marker = tmp_path / "sourced"
    hooks.settings(gpucheck=hooks.gpucheck_exiting(0), extra=f'touch "{marker}"\n')
    (hooks.root / "gpucheck-slurm.env").chmod(0o644)
    assert hooks.run().returncode == 0 and marker.exists()


def test_settings_may_vary_per_node(hooks):
    hooks.settings(gpucheck=hooks.gpucheck_exiting(0), prolog_args="--budget 15s",
                   extra='case "$SLURMD_NODENAME" in n1) GPUCHECK_PROLOG_ARGS="--budget 30s" ;; esac\n')
    assert hooks.run().stdout.strip() == "ARGS: slurm prolog --budget 30s"
    assert hooks.run(SLURMD_NODENAME="n2").stdout.strip() == "ARGS: slurm prolog --budget 15s"


# -- signals: forwarded to gpucheck, which the wrapper waits for ------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded_and_waited_for(hooks, tmp_path, sig):
    marks = tmp_path / "marks"
    child = hooks.fake(tmp_path / "slow-gpucheck", (
        f"trap 'echo term >> {marks}; sleep 1; echo exiting >> {marks}; exit 3' TERM\n"
        f"echo started >> {marks}\n"
        "i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done\nexit 0\n"))
    hooks.settings(gpucheck=child)
    p = subprocess.Popen(["/bin/sh", str(hooks.root / "gpucheck-prolog.sh")],
                         env={"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "42"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (marks.exists() and "started" in marks.read_text()):
            assert time.monotonic() < deadline and p.poll() is None, "the child never started"
            time.sleep(0.05)
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # the child got SIGTERM (SIGINT too: an asynchronous child of sh ignores SIGINT), and the
    # wrapper returned only after it exited; its could-not-judge exit went through on-error
    assert marks.read_text().split() == ["started", "term", "exiting"]
    assert p.returncode == 0 and "gpucheck exited 3 (could not judge)" in err


def test_a_failing_scontrol_is_logged_and_still_fails_closed(hooks):
    hooks.fake(hooks.bin / "scontrol", 'echo "slurm_update error: Invalid node name specified" >&2\nexit 1\n')
    hooks.settings(gpucheck=hooks.gpucheck_exiting(3), extra="GPUCHECK_ON_ERROR=fail\n")
    r = hooks.run(SLURMD_NODENAME="n1\ngpucheck: forged line")
    assert r.returncode == 1
    (line,) = hooks.calls("logger")  # one line, the node name's newline flattened
    assert "-> not drained ('n1 gpucheck: forged line' is not a single node name)" in line
    r = hooks.run()
    assert r.returncode == 1
    assert ("-> not drained (scontrol exit 1: slurm_update error: Invalid node name specified) (on-error fail), "
            "exit 1") in hooks.calls("logger")[-1]


@pytest.mark.slow
def test_sigterm_while_the_real_gpucheck_drains_still_fails_the_job(hooks, tmp_path):
    """Slurm's timeout (or a Ctrl-C) arrives while gpucheck, having judged the node unhealthy,
    waits for `scontrol update ... State=DRAIN`: the wrapper forwards it, gpucheck holds it until
    the drain is done and logged, exits 42, and the wrapper exits 1 (the job does not run on a
    node that was just drained). It used to die of the signal: on-error pass, exit 0."""
    hooks.fake(hooks.bin / "scontrol",
               f'case "$1" in show) exit 0 ;; esac\nprintf "%s\\n" "$*" >> "{hooks.root}/scontrol.calls"\nsleep 3\n')
    hooks.settings(gpucheck=REAL, args=f"--state-dir {tmp_path}/state --snapshot {DBE}")
    p = subprocess.Popen(["/bin/sh", str(hooks.root / "gpucheck-prolog.sh")],
                         env={"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "42"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not hooks.calls("scontrol"):
            assert time.monotonic() < deadline and p.poll() is None, "gpucheck never called scontrol"
            time.sleep(0.02)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # anything left of the wrapper's group
        except ProcessLookupError:
            pass
        p.wait()
    assert p.returncode == 1, err
    (call,) = hooks.calls("scontrol")
    assert call.startswith("update NodeName=n1 State=DRAIN Reason=gpucheck: gpu3 ecc")
    assert "UNHEALTHY" in err and "-> drained, exit 42" in err
    assert hooks.calls("logger") == []  # no could-not-judge line from the wrapper


# -- on_error: the wrapper reads what gpucheck reads ------------------------------------------------

SPELLINGS = [  # a config that is not valid TOML (so gpucheck scans it too), what on_error it says
    ('\ufeff[run]\non_error = "fail"\n[x\n', "fail"),
    ('["run"]\non_error = "fail"\n[x\n', "fail"),
    ("[ 'run' ]   # quoted\n\"on_error\" = 'fail'\n[x\n", "fail"),
    ('run = { level = 1, on_error = "fail" }\n[x\n', "fail"),
    ("run.'on_error' = fail\n[x\n", "fail"),
    ('[run]\non_error = "pass"\non_error = "fail"\n[x\n', "fail"),  # fail wins
    ('[run]\non_error = "pass"\n[x\n', "pass"),
    ('[run]\non_error = "failing"\n[x\n', None),
    ('[node]\non_error = "fail"\n[x\n', None),
    ('[checks.x]\nrun = { on_error = "fail" }\n[x\n', None),
    ('[[run]]\non_error = "fail"\n[x\n', None),
]


@pytest.mark.parametrize("text, want", SPELLINGS)
def test_the_wrapper_and_gpucheck_read_the_same_on_error(hooks, tmp_path, text, want):
    from gpucheck.core.config import read_on_error, scan_on_error

    config = tmp_path / "config.toml"
    config.write_bytes(text.encode())
    assert scan_on_error(text.removeprefix("\ufeff")) == want and read_on_error(config) == want
    hooks.settings(gpucheck=f"{hooks.root}/nowhere", args=f"--config {config}")
    r = hooks.run()
    assert r.returncode == (1 if want == "fail" else 0), r.stderr
    assert bool(hooks.calls("scontrol")) == (want == "fail")


def test_the_wrapper_passes_shellcheck():
    """.ci/run installs shellcheck."""
    p = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (folders owned by another user)")
@pytest.mark.parametrize("plant", ["target-two-levels-up", "folder-link-to-a-users-folder", "link-in-a-users-folder"])
def test_settings_reached_through_links_are_sourced_only_when_no_user_can_change_them(hooks, tmp_path, plant):
    """Every folder on the settings file's real path, and on the real path of the folder holding
    its name, must be root's: a root-owned file two levels below a user's folder, a hook folder
    that is a link into a user's folder, or a link that sits in a user's folder (and that the user
    can point anywhere) is never sourced."""
    env = hooks.root / "gpucheck-slurm.env"
    marker = tmp_path / "sourced"
    hooks.settings(gpucheck=hooks.gpucheck_exiting(0), extra=f'touch "{marker}"\n')
    theirs = tmp_path / "theirs"
    (theirs / "deeper").mkdir(parents=True)
    target = theirs / "deeper" / "slurm.env"
    env.rename(target)
    if plant == "target-two-levels-up":
        env.symlink_to(target)
        run_dir = hooks.root
    elif plant == "folder-link-to-a-users-folder":
        hook_copy = theirs / "deeper" / "gpucheck-prolog.sh"
        hook_copy.write_text(SCRIPT.read_text())
        target.rename(theirs / "deeper" / "gpucheck-slurm.env")
        run_dir = tmp_path / "hooks-link"
        run_dir.symlink_to(theirs / "deeper")
    else:
        mine = tmp_path / "mine"
        mine.mkdir()
        target.rename(mine / "slurm.env")
        (theirs / "deeper" / "gpucheck-prolog.sh").write_text(SCRIPT.read_text())
        (theirs / "deeper" / "gpucheck-slurm.env").symlink_to(mine / "slurm.env")
        run_dir = theirs / "deeper"
    os.chown(theirs, 65534, 65534)
    r = subprocess.run(["/bin/sh", str(run_dir / "gpucheck-prolog.sh")], env={"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "n1"},
                       capture_output=True, text=True, timeout=60)
    assert not marker.exists()
    assert r.returncode == 0 and "not sourced: " in r.stderr and f"{theirs} is owned by uid 65534" in r.stderr


def test_settings_through_a_link_between_root_folders_are_sourced(hooks, tmp_path):
    env = hooks.root / "gpucheck-slurm.env"
    marker = tmp_path / "sourced"
    hooks.settings(gpucheck=hooks.gpucheck_exiting(0), extra=f'touch "{marker}"\n')
    (tmp_path / "etc").mkdir()
    env.rename(tmp_path / "etc" / "slurm.env")
    env.symlink_to(tmp_path / "etc" / "slurm.env")
    r = hooks.run()
    assert r.returncode == 0 and marker.exists(), r.stderr
