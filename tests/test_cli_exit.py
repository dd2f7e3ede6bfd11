"""Exit codes when gpucheck itself fails: an uncaught exception or an output that cannot be
written is "could not judge" (3, one line on stderr), never "unhealthy" (1); a verdict already
judged keeps its exit code when only printing it failed (docs/exit-codes.md)."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck import app
from gpucheck.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
HEALTHY, DBE = SNAPS / "h100-healthy.json", SNAPS / "h100-ecc-dbe.json"


def gpucheck_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def private_full_device(folder: Path) -> Path:
    """Our own /dev/full (character device 1:7): every write fails with ENOSPC."""
    path = folder / "full"
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    return path


def _raise(exc: BaseException):
    def boom(*args, **kwargs):
        raise exc

    return boom


# -- main(): what no command handled --------------------------------------------------------------

def test_an_uncaught_exception_in_a_judging_command_is_exit_3_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(app, "prepare", _raise(RuntimeError("boom")))
    rc = main(["run", "--snapshot", str(HEALTHY), "--no-history"])
    err = capsys.readouterr().err
    assert rc == 3
    assert err.startswith("gpucheck run: error: could not judge: internal error: RuntimeError: boom (at gpucheck/app.py:")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_an_uncaught_exception_under_on_error_fail_is_exit_1(monkeypatch, capsys):
    """Fail-closed sites asked for it: could not judge -> 1, said on the same line."""
    monkeypatch.setattr(app, "prepare", _raise(KeyError("gpus")))
    rc = main(["run", "--snapshot", str(HEALTHY), "--no-history", "--on-error=fail"])
    err = capsys.readouterr().err
    assert rc == 1 and "could not judge: internal error: KeyError" in err and "(--on-error fail: exit 1)" in err


def test_a_closed_pipe_in_a_judging_command_is_exit_3_not_0(monkeypatch, capsys):
    """A reader gone (`| head`) used to make any command exit 0: a sweep or an xid run that
    found a fault then said "healthy"."""
    monkeypatch.setattr(app, "prepare", _raise(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    rc = main(["run", "--snapshot", str(DBE), "--no-history"])
    assert rc == 3 and "could not judge" in capsys.readouterr().err


def test_a_closed_pipe_in_a_command_that_judges_nothing_is_still_0(monkeypatch, capsys):
    import gpucheck.tests_suite.registry as registry

    monkeypatch.setattr(registry, "all_checks", _raise(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    assert main(["list"]) == 0
    assert capsys.readouterr().err == ""


def test_a_full_stdout_in_a_command_that_prints_its_own_report_is_exit_3(tmp_path):
    """`gpucheck xid` prints its table itself: stdout on a full disk is could-not-judge in one
    line (it was a traceback and exit 1, "unhealthy", for a clean log)."""
    log = tmp_path / "kern.log"
    log.write_text("2024-01-01T00:00:00+00:00 node kernel: nothing to see\n")
    with open(private_full_device(tmp_path), "w") as sink:
        r = subprocess.run([sys.executable, "-m", "gpucheck", "xid", "--file", str(log), "--no-nvml"],
                           env=gpucheck_env(), stdout=sink, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 3, r.stderr[-600:]
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert r.stderr.startswith("gpucheck xid: error: could not judge: ") and "No space left on device" in r.stderr


# -- app.execute: the verdict stands when only printing it failed ---------------------------------

class FailingStdout:
    """A stdout whose every write fails like a full disk."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "table"])
def test_a_verdict_keeps_its_exit_code_when_stdout_fails(tmp_path, monkeypatch, capsys, as_json):
    warnings: list[str] = []
    monkeypatch.setattr(sys, "stdout", FailingStdout())
    rc = app.execute(app.RunRequest(snapshot_path=str(DBE), state_dir=str(tmp_path / "state"), json=as_json,
                                    output=str(tmp_path / "verdict.json")), on_warning=warnings.append)
    err = capsys.readouterr().err
    assert rc == 1  # the GPU's uncorrectable ECC error, judged before the printing failed
    assert "the verdict was not printed on stdout: OSError" in err and "the verdict stands (fail, exit 1)" in err
    assert warnings and "not printed" in warnings[0]
    assert json.loads((tmp_path / "verdict.json").read_text())["exit_code"] == 1  # the outputs still written
    assert len((tmp_path / "state" / "history.jsonl").read_text().splitlines()) == 1


def test_a_bug_in_the_table_never_changes_the_verdict(tmp_path, monkeypatch, capsys):
    import gpucheck.render.terminal as output

    monkeypatch.setattr(output, "print_verdict", _raise(KeyError("columns")))
    rc = app.execute(app.RunRequest(snapshot_path=str(HEALTHY), history=False))
    assert rc == 0
    assert "the verdict was not printed on stdout: KeyError" in capsys.readouterr().err


@pytest.mark.slow
def test_a_stdout_that_cannot_encode_the_table_never_crashes_a_healthy_run(tmp_path):
    """An ASCII stdout (LANG=C): what it cannot encode is escaped, the run exits 0."""
    r = subprocess.run([sys.executable, "-m", "gpucheck", "run", "--snapshot", str(HEALTHY), "--no-history"],
                       env=gpucheck_env(PYTHONIOENCODING="ascii"), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr[-600:]
    assert b"Traceback" not in r.stderr and b"PASS" in r.stdout


@pytest.mark.parametrize("snapshot, code", [(HEALTHY, 0), (DBE, 1)], ids=["healthy", "dbe"])
def test_a_run_started_with_stdout_closed_still_judges(tmp_path, snapshot, code):
    """`gpucheck run >&-`: descriptor 1 becomes /dev/null (no file gpucheck opens can take its
    number), the verdict is judged, recorded, and its code is the exit code."""
    argv = [sys.executable, "-m", "gpucheck", "run", "--snapshot", str(snapshot), "--state-dir", str(tmp_path / "s")]
    r = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *argv], env=gpucheck_env(), stderr=subprocess.PIPE,
                       text=True, timeout=120)
    assert r.returncode == code, r.stderr[-600:]
    assert "Traceback" not in r.stderr and "could not judge" not in r.stderr
    assert len((tmp_path / "s" / "history.jsonl").read_text().splitlines()) == 1
