"""`gpucheck slurm prolog|epilog` never drains a node because gpucheck itself failed.

- only a judged fault (or could-not-judge with on-error fail) exits EXIT_HOOK_UNHEALTHY (42);
  every other outcome exits 0 after one syslog line and a history record;
- a usage error in the hook's arguments is such an outcome (not exit 2), and so is a crash;
- on-error: --on-error, else GPUCHECK_ON_ERROR, else the config's [run] on_error, read on its
  own so that a fail-closed choice survives the config's other errors;
- the verdict is captured in memory: no failed write (TMPDIR, history, cursors, syslog, a
  full stdout/stderr) changes the judgement.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import syslog
from pathlib import Path

import pytest

from gpucheck import app
from gpucheck.core import state as state_mod
from gpucheck.core.config import read_on_error
from gpucheck.core.verdict import Verdict
from gpucheck.fleet import hook as hook_mod

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
HEALTHY, DBE = SNAPS / "h100-healthy.json", SNAPS / "h100-ecc-dbe.json"
ENV = {"SLURMD_NODENAME": "gpu7", "SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "alice"}


class FakeSlurm:
    def __init__(self):
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        return 0, "", ""


def history(root: Path) -> list[dict]:
    path = root / "history.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def hook(tmp_path, environ=ENV, execute=None, log=None, **opts):
    sl, logs = FakeSlurm(), []
    options = hook_mod.HookOptions("prolog", state_dir=str(tmp_path / "state"), **opts)
    out = hook_mod.run_hook(options, environ, runner=sl, log=log or (lambda p, m: logs.append((p, m))),
                            execute=execute)
    return out, sl.calls, logs


# -- on-error: read on its own -----------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ('[run]\non_error = "fail"\n', "fail"),
    ('[run]\non_error = "pass"\n', "pass"),
    ('[run]\non_error = "fail"\nno_such_key = 1\n', "fail"),  # valid TOML, invalid config
    ('[run]\non_error = "fail"\n[checks.nope]\nx = 1\n', "fail"),
    ("[run]\non_error = 'fail'  # closed\n[node\n", "fail"),  # not TOML
    ('run.on_error = "fail"\nlevel = = 2\n', "fail"),
    ('[node]\non_error = "fail"\n[run\n', None),  # not in [run]
    ('[run]\non_error = "maybe"\n', None),
    ('[run]\nlevel = 1\n', None),
    ("", None),
    # every TOML spelling of the key, and a byte order mark (a Windows editor), valid TOML or not
    ('\ufeff[run]\non_error = "fail"\n', "fail"),
    ('\ufeff[run]\non_error = "fail"\n[node\n', "fail"),
    ('["run"]\non_error = "fail"\n[node\n', "fail"),
    ("[ 'run' ]  # quoted\n'on_error' = \"fail\"\n[node\n", "fail"),
    ('run = { level = 1, on_error = "fail" }\n[node\n', "fail"),
    ('"run"."on_error" = "fail"\n[node\n', "fail"),
    ('run = { on_error = "pass" }\n', "pass"),
    ('[run]\non_error = "failing"\n[node\n', None),
    ('[checks.xid]\nrun = { on_error = "fail" }\n[node\n', None),  # not the run table
])
def test_read_on_error_survives_the_configs_other_errors(tmp_path, text, want):
    path = tmp_path / "config.toml"
    path.write_text(text)
    assert read_on_error(path) == want


def test_read_on_error_of_a_missing_or_unreadable_file(tmp_path):
    assert read_on_error(tmp_path / "none.toml") is None
    assert read_on_error(tmp_path) is None  # a folder
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\n[run]\non_error = 'fail'\n")
    assert read_on_error(tmp_path / "bin.toml") == "fail"
    assert read_on_error(tmp_path / ("x" * 300)) is None  # a name too long: nothing, no exception


def _read_on_error_capped(path: Path) -> tuple[int | None, str]:
    """read_on_error(path) in a child whose address space is capped at 512 MiB (a reader without
    end fails there, never eats this machine's memory): (exit code or None if it was still
    running after 20 s, its stdout)."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))

    code = f"from gpucheck.core.config import read_on_error\nprint(read_on_error({str(path)!r}))\n"
    p = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=cap)
    try:
        out, _ = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return None, ""
    return p.returncode, out.strip()


def test_read_on_error_never_reads_a_device_and_scans_the_head_of_a_huge_file(tmp_path):
    """A device that never ends (our own /dev/zero) is no config: None at once, nothing read. A
    config past the 1 MiB limit is no valid config, but its fail-closed line near the top still
    counts (the rest is not read)."""
    zero = tmp_path / "zero"
    os.mknod(zero, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    assert _read_on_error_capped(zero) == (0, "None")
    huge = tmp_path / "huge.toml"
    huge.write_text('[run]\non_error = "fail"\n' + "# padding\n" * 200_000)
    assert huge.stat().st_size > (1 << 20) and read_on_error(huge) == "fail"


def test_fail_closed_config_with_another_error_drains(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[run]\non_error = "fail"\nno_such_key = 1\n')
    out, calls, logs = hook(tmp_path, config_path=str(config), snapshot=str(HEALTHY))
    assert out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY and out.judgement == "could-not-judge" and out.drained
    (call,) = calls
    assert call[4].startswith("Reason=gpucheck: could not judge: usage or configuration error: ")
    assert len(call[4]) <= len("Reason=") + 60  # NHC-style: short; the full cause is in the log
    (priority, line), = logs
    assert priority == syslog.LOG_ERR and line.endswith("-> drained (on-error fail), exit 42 (the wrapper exits 1)")
    assert "run.no_such_key: unknown key" in line
    (v,) = history(tmp_path / "state")  # no verdict came out of the pipeline: the hook records one
    assert v["status"] == "error" and v["results"][0]["check"] == "slurm.prolog"
    assert "no_such_key" in v["results"][0]["summary"]


@pytest.mark.parametrize("explicit, env_value, config, want", [
    (None, None, None, "pass"),
    (None, None, "fail", "fail"),
    (None, "fail", None, "fail"),
    (None, "pass", "fail", "pass"),  # the hook's own setting wins over the config
    ("pass", "fail", "fail", "pass"),  # --on-error wins over everything
    ("fail", "pass", None, "fail"),
    (None, "FAIL ", "fail", "fail"),  # not pass/fail: passed over
])
def test_on_error_precedence(tmp_path, explicit, env_value, config, want):
    path = tmp_path / "config.toml"
    if config:
        path.write_text(f'[run]\non_error = "{config}"\n')
    environ = {hook_mod.ON_ERROR_ENV: env_value} if env_value is not None else {}
    assert hook_mod.resolve_on_error(explicit, environ, str(path))[0] == want


def test_gpucheck_on_error_from_the_environment_fails_closed(tmp_path):
    out, calls, _ = hook(tmp_path, environ={**ENV, "GPUCHECK_ON_ERROR": "fail"}, execute=lambda req, on_verdict, on_warning=None: 3)
    assert out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY and calls and out.plan["on_error_from"] == "GPUCHECK_ON_ERROR"


# -- outputs never mask the verdict ------------------------------------------------------------------

def test_failing_writes_never_change_an_unhealthy_judgement(tmp_path, monkeypatch):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    from gpucheck.platform import safeio

    monkeypatch.setattr(safeio, "replace_private", full)  # cursors (the state directory's files)
    monkeypatch.setattr(safeio, "write_output", full)  # --output / the old hook's temporary file
    monkeypatch.setattr(state_mod.State, "append_history", full)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "no-such-folder"))

    def broken_syslog(priority, line):
        raise OSError(errno.ENOSPC, "syslog is gone")

    out, calls, _ = hook(tmp_path, execute=app.execute, log=broken_syslog, snapshot=str(DBE))
    assert out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY and out.judgement == "unhealthy" and out.drained
    assert calls[0][4] == "Reason=gpucheck: gpu3 ecc-dbe -> reset-gpu"
    assert "ENOSPC" in out.plan["cursor_error"] or "No space" in out.plan["cursor_error"]


def test_an_output_failure_after_the_verdict_keeps_the_verdict(tmp_path, capsys):
    rc = subprocess.run([sys.executable, "-m", "gpucheck", "run", "--json", "--no-history", "--snapshot", str(DBE)],
                        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    bad = Verdict.from_json(json.loads(rc.stdout))

    def execute(req, on_verdict, on_warning=None):
        on_verdict(bad)
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")  # printing the table failed

    out, calls, _ = hook(tmp_path, execute=execute)
    assert out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY and out.judgement == "unhealthy" and calls
    assert "BrokenPipeError" in out.plan["output_error"]


@pytest.fixture
def full_tmpdir(tmp_path):
    """A nearly full TMPDIR: a 16 KiB tmpfs with one 4 KiB page left, room for Python's probe
    of a usable temporary folder but not for a verdict (needs root and mount rights)."""
    where = tmp_path / "full"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k,mode=1777", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {r.stderr.strip()}")
    try:
        fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.write(fd, b"x" * 12 * 1024)
        finally:
            os.close(fd)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _prolog_on_dbe(tmp_path, sink, **env):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {tmp_path}/calls\n')
    scontrol.chmod(0o755)
    argv = [sys.executable, "-m", "gpucheck", "slurm", "prolog", "--snapshot", str(DBE),
            "--state-dir", str(tmp_path / "state"), "--scontrol", str(scontrol)]
    r = subprocess.run(argv, env={**os.environ, **ENV, "PYTHONPATH": str(ROOT), **env}, stdout=sink, stderr=sink,
                       timeout=120)
    calls = tmp_path / "calls"
    return r, calls.read_text() if calls.exists() else ""


def test_a_full_tmpdir_never_masks_an_unhealthy_verdict(tmp_path, full_tmpdir):
    """The old hook captured the verdict through a temporary --output file: with TMPDIR full its
    write failed and the write error (exit 2) turned an unhealthy node into could-not-judge."""
    with open(os.devnull, "w") as sink:
        r, calls = _prolog_on_dbe(tmp_path, sink, TMPDIR=str(full_tmpdir))
    assert r.returncode == hook_mod.EXIT_HOOK_UNHEALTHY
    assert calls.startswith("update NodeName=gpu7 State=DRAIN Reason=gpucheck: gpu3 ecc-dbe -> reset-gpu")


@pytest.mark.slow
def test_full_stdout_and_stderr_never_mask_an_unhealthy_verdict(tmp_path):
    """/dev/full as stdout made Python exit 120 at its final flush, instead of the verdict's code."""
    with open("/dev/full", "w") as sink:
        r, calls = _prolog_on_dbe(tmp_path, sink)
    assert r.returncode == hook_mod.EXIT_HOOK_UNHEALTHY
    assert calls.startswith("update NodeName=gpu7 State=DRAIN Reason=gpucheck: gpu3 ecc-dbe -> reset-gpu")


# -- gpucheck's own failures: logged, recorded, on-error -----------------------------------------------

def test_a_crash_is_logged_and_recorded_and_passes(tmp_path):
    def execute(req, on_verdict, on_warning=None):
        raise KeyError("gpus")

    out, calls, logs = hook(tmp_path, execute=execute)
    assert (out.exit_code, out.judgement, calls) == (0, "could-not-judge", [])
    assert logs[-1][0] == syslog.LOG_WARNING and "internal error: KeyError" in logs[-1][1]
    (v,) = history(tmp_path / "state")
    assert v["exit_code"] == 3 and "internal error: KeyError" in v["results"][0]["summary"]


def test_a_hostile_node_name_is_never_drained(tmp_path):
    def execute(req, on_verdict, on_warning=None):
        return 1

    out, calls, logs = hook(tmp_path, environ={**ENV, "SLURMD_NODENAME": "gpu[1-512]"}, execute=execute)
    assert out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY and not out.drained and calls == []
    assert any("refusing to drain 'gpu[1-512]'" in m for _, m in logs)
    out, calls, logs = hook(tmp_path, environ={**ENV, "SLURMD_NODENAME": "gpu7\nslurm prolog: forged"},
                            execute=execute)
    assert out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY and calls == []
    assert all("\n" not in m for _, m in logs) and "\n" not in out.log_line


def test_an_scontrol_that_cannot_run_is_logged_not_a_crash(tmp_path):
    not_executable = tmp_path / "scontrol"
    not_executable.write_text("")
    logs = []
    out = hook_mod.run_hook(hook_mod.HookOptions("prolog", state_dir=str(tmp_path), scontrol=str(not_executable)),
                            ENV, log=lambda p, m: logs.append(m), execute=lambda req, on_verdict, on_warning=None: 1)
    assert out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY and not out.drained
    assert any("cannot drain" in m and "exit 126" in m for m in logs)


def _cli(tmp_path, *args, **env):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {tmp_path}/calls\n')
    scontrol.chmod(0o755)
    argv = [sys.executable, "-m", "gpucheck", "slurm", *args, "--state-dir", str(tmp_path / "state"),
            "--scontrol", str(scontrol)]
    r = subprocess.run(argv, env={**os.environ, **ENV, "PYTHONPATH": str(ROOT), **env}, capture_output=True,
                       text=True, timeout=120)
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return r, calls


@pytest.mark.parametrize("bad, named", [
    (["--budget", "5x"], "bad duration '5x'"),
    (["--workers", "0"], "'--workers': 0 is not in the range"),
    (["--device", "gpu"], "'--device'"),
    (["--bogus"], "No such option '--bogus'"),
    (["--on-error", "maybe"], "'--on-error'"),
])
def test_usage_error_in_the_hook_arguments_is_could_not_judge(tmp_path, bad, named):
    r, calls = _cli(tmp_path, "prolog", "--snapshot", str(HEALTHY), *bad)
    assert r.returncode == 0 and calls == [], r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("gpucheck: slurm prolog job=4242 node=gpu7 user=alice: could not judge: usage error "
                           "in the hook's arguments: ") and named in line
    assert line.endswith("-> not drained (on-error pass), exit 0")
    (v,) = history(tmp_path / "state")
    assert v["status"] == "error" and named in v["results"][0]["summary"]


def test_usage_error_in_the_hook_arguments_fails_closed_when_asked(tmp_path):
    r, calls = _cli(tmp_path, "epilog", "--workers", "0", "--on-error", "fail")
    assert r.returncode == hook_mod.EXIT_HOOK_UNHEALTHY, r.stderr
    (call,) = calls
    assert call.startswith("update NodeName=gpu7 State=DRAIN Reason=gpucheck: could not judge: usage error")
    r, calls = _cli(tmp_path, "prolog", "--budget", "5x", GPUCHECK_ON_ERROR="fail")
    assert r.returncode == hook_mod.EXIT_HOOK_UNHEALTHY and len(calls) == 2
    assert history(tmp_path / "state")[-1]["results"][0]["check"] == "slurm.prolog"


def test_hook_help_outside_slurm_prints_the_help_and_exits_0(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    r = subprocess.run([sys.executable, "-m", "gpucheck", "slurm", "prolog", "--help", "--state-dir",
                        str(tmp_path / "state")], capture_output=True, text=True,
                       env={**env, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert r.returncode == 0 and "42" in r.stdout and r.stderr == ""
    assert history(tmp_path / "state") == []


@pytest.mark.parametrize("on_error, want", [("pass", 0), ("fail", hook_mod.EXIT_HOOK_UNHEALTHY)])
def test_help_in_a_hooks_arguments_is_a_logged_could_not_judge(tmp_path, on_error, want):
    """GPUCHECK_ARGS=--help in the wrapper's settings: every prolog printed the help and exited 0,
    silently, examining nothing. As a hook (Slurm's environment) it is could not judge: logged,
    recorded, then on-error (pass: exit 0, the job runs; fail: drained, 42)."""
    r, calls = _cli(tmp_path, "prolog", "--help", GPUCHECK_ON_ERROR=on_error)
    assert r.returncode == want, r.stderr
    assert "Show this message and exit." in r.stdout  # the help itself still goes to slurmd's log
    (line,) = r.stderr.splitlines()
    assert "could not judge: --help in the hook's arguments: the help was printed, nothing was examined" in line
    assert bool(calls) == (on_error == "fail")
    (v,) = history(tmp_path / "state")
    assert v["status"] == "error" and "--help" in v["results"][0]["summary"]


def test_a_config_name_too_long_in_a_hook_is_could_not_judge(tmp_path):
    r, calls = _cli(tmp_path, "prolog", "--snapshot", str(HEALTHY), "--config", str(tmp_path / ("x" * 300)))
    assert r.returncode == 0 and calls == [], r.stderr
    line = r.stderr.splitlines()[-1]
    assert "Traceback" not in r.stderr and "could not judge" in line
    assert "usage or configuration error: " in line and "file name too long" in line


def test_a_cursor_lock_held_by_a_hung_process_never_changes_the_judgement(tmp_path, monkeypatch):
    """Another gpucheck hangs holding the jobs cursor's lock: the prolog waits a bounded time,
    notes it, and still drains and exits as judged."""
    import fcntl

    monkeypatch.setattr(state_mod, "CURSOR_LOCK_TIMEOUT_S", 0.3)
    st = state_mod.State(tmp_path / "state")
    st.ensure()
    holder = os.open(st.root / "cursor-slurm-jobs.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        out, calls, _ = hook(tmp_path, execute=app.execute, snapshot=str(DBE))
    finally:
        os.close(holder)
    assert out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY and out.judgement == "unhealthy" and calls
    assert "locked by another gpucheck" in out.plan["cursor_error"]